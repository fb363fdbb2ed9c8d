"""The peers ``kode bench speculation`` compares Kode with, run in the benchmark's own
process: llama-cpp-python's prompt-lookup decoding (``PldPeer``, on the thread of Kode's
own llama.cpp work) and llama.cpp's ``llama-server`` in each speculative mode its build
offers (``start_servers``, ``bench/llama_server.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


async def on_llama_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn`` on the thread that runs Kode's own llama.cpp work (see
    ``backends.llama.library.llama_thread``): a peer computing on another thread would
    slow Kode's plain decoding by a third for the rest of the run and skew every ratio."""
    from kode.backends.llama.library import llama_thread

    return await asyncio.get_running_loop().run_in_executor(llama_thread(), fn, *args)


class PldPeer:
    """llama-cpp-python's prompt-lookup speculative decoding, greedy.

    ``Llama(draft_model=...)`` forces ``logits_all``: it keeps a float32 row of logits for
    every context position (``n_ctx x n_vocab``: 0.6 GB per 1024 positions for Qwen's
    152k vocabulary), so the context is sized to the longest prompt plus the generation.
    """

    def __init__(self, model: Path, n_ctx: int, num_pred_tokens: int, threads: int) -> None:
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.llm = Llama(
            model_path=str(model),
            n_ctx=n_ctx,
            n_batch=512,
            n_threads=threads,
            n_threads_batch=threads,
            draft_model=LlamaPromptLookupDecoding(num_pred_tokens=num_pred_tokens),
            logits_all=True,
            verbose=False,
        )

    def generate(
        self, tokens: Sequence[int], max_tokens: int, is_stop: Callable[[int], bool]
    ) -> tuple[list[int], float | None, float, float]:
        """(tokens, decode ms per token after the first, ttft ms, total ms)."""
        out: list[int] = []
        start = time.perf_counter()
        first = start
        gen = self.llm.generate(
            list(tokens),
            top_k=1,
            top_p=1.0,
            min_p=0.0,
            temp=0.0,
            repeat_penalty=1.0,
        )
        try:
            for token in gen:
                if is_stop(int(token)):
                    break
                if not out:
                    first = time.perf_counter()
                out.append(int(token))
                if len(out) >= max_tokens:
                    break
        finally:
            gen.close()
        end = time.perf_counter()
        per = (end - first) * 1000.0 / max(len(out) - 1, 1) if len(out) >= 2 else None
        return out, per, (first - start) * 1000.0, (end - start) * 1000.0

    def close(self) -> None:
        self.llm.close()


async def start_servers(
    stack: contextlib.AsyncExitStack,
    model: Path,
    draft: Callable[[], Path],
    log_dir: Path,
    facts: dict[str, Any],
) -> list[Any]:
    """A ``llama-server`` for ``model`` in each mode its build offers (``draft()`` gives
    the draft model, asked only when a binary is found), each stopped when ``stack``
    closes; none without a binary. ``facts`` gets the binary's path."""
    from kode.bench import llama_server

    binary = llama_server.find_binary()
    facts["llama_server"] = None if binary is None else str(binary)
    if binary is None:
        return []
    modes = llama_server.speculation_modes(llama_server.help_text(binary), draft())
    servers = []
    for mode in modes:
        try:
            server = await stack.enter_async_context(
                llama_server.serve(binary, model, mode, log_dir=log_dir)
            )
        except RuntimeError as exc:
            print(f"kode bench: skipping {mode.name}: {exc}", file=sys.stderr)
            continue
        servers.append(server)
    return servers
