"""A local backend on PyTorch and transformers: one model, one KV cache, one worker thread.

``TorchBackend`` is the generic ``LocalBackend`` over a ``TorchEngine``: every torch call
runs on the backend's own worker thread; the cancel flag is checked before each forward
(prompt chunks included); the KV cache is reused for the longest common token prefix
(``CausalLM.prefill`` crops it to that prefix). Speculation ``none``, ``ngram``, ``auto``
and ``draft`` run through ``backends/steppers.py``; ``lookahead`` needs several KV
sequences in one batch and is llama.cpp-only.

Models load from a local safetensors directory, a GGUF file (dequantized by
transformers, which needs the ``gguf`` package), the default model aliases
(``default``, ``small``, ``hf:OWNER/REPO/FILE.gguf``, resolved by ``backends.models``)
or a hub id where there is network. Weights are float32 on CPU and bfloat16 on CUDA.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import torch
from kode.backends.base import Backend, Sampling, SpeculationMethod
from kode.backends.defaults import CONTEXT_SIZE
from kode.backends.errors import BackendError, ModelError
from kode.backends.guided import Guide
from kode.backends.local import (
    NO_DRAFT_MODEL,
    DraftOptions,
    LocalBackend,
    TextStream,
)
from kode.backends.speculative import CostCurve
from kode.backends.steppers import step_each
from kode.backends.torch.target import CausalLM, Picker, TorchDraft, TorchTarget, calibrate
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

NO_OPTIONS = DraftOptions()  # the defaults


class Vocab:
    """A transformers tokenizer as the backend needs it: ids in, text out, stop tokens."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos: Sequence[int] = ()) -> None:
        self.tokenizer = tokenizer
        stops = {i for i, tok in tokenizer.added_tokens_decoder.items() if tok.special}
        stops.update(eos)
        if tokenizer.eos_token_id is not None:
            stops.add(int(tokenizer.eos_token_id))
        self.stops = frozenset(stops)
        self._lock = threading.Lock()  # count_tokens (event loop) vs the worker thread

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        """Token ids of ``text``; ``special`` parses ``<|fim_prefix|>`` and friends."""
        with self._lock:
            ids: list[int] = self.tokenizer.encode(
                text, add_special_tokens=False, split_special_tokens=not special
            )
        return ids

    def is_stop(self, token: int) -> bool:
        """End-of-generation and control tokens (FIM markers, ``<|file_sep|>``, ...)."""
        return token in self.stops

    def decode(self, tokens: Sequence[int]) -> str:
        text = self.tokenizer.decode(list(tokens), skip_special_tokens=True)
        return text if isinstance(text, str) else "".join(text)


class Detokenizer:
    """Streams text from token ids: decodes a short window and emits what it added, holding
    back while the window ends inside a UTF-8 sequence (shown as U+FFFD).

    Example (byte-level BPE splits "é" over two tokens): ``push`` returns ``""`` for the
    first half and ``"é"`` for the second.
    """

    def __init__(self, vocab: Vocab) -> None:
        self.vocab = vocab
        self.ids: list[int] = []
        self._prefix = 0  # window start: context for decoding the tokens after _read
        self._read = 0  # tokens before this were emitted

    def push(self, token: int) -> str:
        self.ids.append(token)
        return self._advance(final=False)

    def flush(self) -> str:
        return self._advance(final=True)

    def _advance(self, *, final: bool) -> str:
        done = self.vocab.decode(self.ids[self._prefix : self._read])
        text = self.vocab.decode(self.ids[self._prefix :])
        if len(text) <= len(done) or (text.endswith("\ufffd") and not final):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return text[len(done) :]


@dataclass(frozen=True, slots=True)
class Loaded:
    """A model and its tokenizer, as loaded from one reference."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None
    name: str


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_pretrained(
    ref: str | Path, device: torch.device | None = None, *, tokenizer: bool = True
) -> Loaded:
    """Load a causal LM and (unless ``tokenizer`` is false) its tokenizer; blocking.

    ``ref``: ``default`` / ``small`` / ``hf:OWNER/REPO/FILE.gguf`` (via ``backends.models``),
    a GGUF file (dequantized), a directory of safetensors weights, or a hub id. float32 on
    CPU, bfloat16 on CUDA.
    """
    from kode.backends import models

    device = device or default_device()
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    name = str(ref)
    path = Path(name).expanduser()
    if name in models.DEFAULT_MODELS or name.startswith("hf:"):
        path = models.resolve(name)
    kwargs: dict[str, Any] = {}
    if path.is_file():
        models.check_gguf(path)
        source: str | Path = path.parent
        kwargs["gguf_file"] = path.name
    elif path.is_dir():
        source = path
    elif "/" in name and not name.startswith((".", "/", "~")):
        source = name  # a hub id
    else:
        raise ModelError(f"no model at {name!r} (a GGUF file, a model directory or a hub id)")
    try:
        tok = AutoTokenizer.from_pretrained(source, **kwargs) if tokenizer else None
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **kwargs)
    except (OSError, ValueError, ImportError, RuntimeError) as exc:
        raise ModelError(f"transformers could not load {name!r}: {exc}") from exc
    torch.nn.Module.to(model, device)  # (transformers' own ``to`` is typed loosely)
    torch.nn.Module.eval(model)
    return Loaded(model, tok, path.name if path.exists() else name)


def _check_same_vocab(target: PreTrainedModel, draft: PreTrainedModel) -> None:
    t = target.config.get_text_config().vocab_size
    d = draft.config.get_text_config().vocab_size
    if t != d:
        raise ModelError(f"the draft model's vocabulary ({d}) differs from the target's ({t})")


class TorchEngine:
    """A transformers model with one KV cache (and a draft model's), as ``LocalBackend``
    drives them."""

    name = "torch"

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        draft: PreTrainedModel | None = None,
        name: str = "",
        n_ctx: int = CONTEXT_SIZE,
    ) -> None:
        self.lm = CausalLM(model)
        self.draft_lm = None if draft is None else CausalLM(draft)
        eos = model.generation_config.eos_token_id if model.generation_config else None
        self.vocab = Vocab(tokenizer, [eos] if isinstance(eos, int) else (eos or []))
        self.model_name = name or str(model.config.name_or_path or model.config.model_type)
        self.n_ctx = n_ctx

    @property
    def calls(self) -> int:
        return self.lm.calls

    def tokenize(self, text: str, *, special: bool = True) -> list[int]:
        return self.vocab.tokenize(text, special=special)

    def is_stop(self, token: int) -> bool:
        return self.vocab.is_stop(token)

    def text_stream(self) -> TextStream:
        return Detokenizer(self.vocab)

    # Token healing needs every token's bytes; the tokenizer gives text, and Kode heals
    # with llama.cpp only (the torch engine is the optional second engine).
    heals = False

    def pieces(self) -> list[bytes]:
        raise BackendError("the torch engine does not heal tokens")

    def target(self, sampling: Sampling, guide: Guide | None = None) -> TorchTarget:
        """``guide`` is never given: the names monitor needs ``pieces`` (``heals``)."""
        return TorchTarget(self.lm, Picker(sampling))

    width = 1  # one cache: one generation at a time

    def step_together(self, steps: Sequence[tuple[TorchTarget, int]]) -> list[int]:
        return step_each(steps)

    def refuse(self, method: SpeculationMethod) -> str | None:
        if method is SpeculationMethod.LOOKAHEAD:
            return (
                "speculation 'lookahead' is llama.cpp-only (it decodes several KV sequences "
                "in one batch); the torch backend offers none, ngram, draft and auto"
            )
        if method is SpeculationMethod.DRAFT and self.draft_lm is None:
            return NO_DRAFT_MODEL
        return None

    def draft(self, target: TorchTarget) -> TorchDraft:
        assert self.draft_lm is not None  # LocalBackend asks ``refuse`` first
        return TorchDraft(self.draft_lm, target.picker)

    def lookahead(self, target: TorchTarget, sources: Sequence[Sequence[int]]) -> NoReturn:
        raise BackendError(self.refuse(SpeculationMethod.LOOKAHEAD) or "")  # refused earlier

    def logit_gaps(self, prompt: str, tokens: Sequence[int]) -> list[float]:
        """Top-2 logit gaps, the whole continuation in one forward."""
        lm = self.lm
        _, first = lm.prefill(self.vocab.tokenize(prompt))
        rows = [first]
        if len(tokens) > 1:
            rows.extend(lm.forward(tokens[:-1]))
        gaps = []
        for row in rows[: len(tokens)]:
            top2 = torch.topk(row, 2).values
            gaps.append(float(top2[0] - top2[1]))
        return gaps

    def close(self) -> None:
        cuda = self.lm.device.type == "cuda"
        self.lm.reset()
        if self.draft_lm is not None:
            self.draft_lm.reset()
        if cuda:
            torch.cuda.empty_cache()


class TorchBackend(LocalBackend[TorchTarget]):
    """Local generation with transformers; ``await TorchBackend.load(ref)`` or, for models
    already in memory, ``await TorchBackend.create(model, tokenizer)``."""

    engine: TorchEngine

    @property
    def vocab(self) -> Vocab:
        return self.engine.vocab

    @property
    def n_ctx(self) -> int:
        return self.engine.n_ctx

    @classmethod
    async def create(
        cls,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        draft: PreTrainedModel | None = None,
        draft_options: DraftOptions = NO_OPTIONS,
        curve: CostCurve | None = None,
        name: str = "",
        n_ctx: int = CONTEXT_SIZE,
        n_threads: int | None = None,
    ) -> TorchBackend:
        """A backend over models already in memory; measures the cost curve unless given.

        ``n_threads`` sets torch's intra-op threads (process-wide).
        """

        def models() -> tuple[Loaded, Loaded | None]:
            small = None if draft is None else Loaded(draft, None, "")
            return Loaded(model, tokenizer, name), small

        return await cls._start(models, draft_options, curve, n_ctx, n_threads)

    @classmethod
    async def load(
        cls,
        model: str | Path,
        *,
        draft: str | Path | None = None,
        draft_options: DraftOptions = NO_OPTIONS,
        device: str | None = None,
        n_ctx: int = CONTEXT_SIZE,
        n_threads: int | None = None,
        curve: CostCurve | None = None,
    ) -> TorchBackend:
        """Load ``model`` (and ``draft`` for ``speculation=draft``) on ``device`` (CUDA when
        available, else CPU), then measure the target's cost curve unless ``curve`` is given.
        """
        dev = torch.device(device) if device else default_device()

        def models() -> tuple[Loaded, Loaded | None]:
            target = load_pretrained(model, dev)
            small = None if draft is None else load_pretrained(draft, dev, tokenizer=False)
            return target, small

        return await cls._start(models, draft_options, curve, n_ctx, n_threads)

    @classmethod
    async def _start(
        cls,
        models: Callable[[], tuple[Loaded, Loaded | None]],
        draft_options: DraftOptions,
        curve: CostCurve | None,
        n_ctx: int,
        n_threads: int | None,
    ) -> TorchBackend:
        """Load and calibrate on the worker thread that will run every generation."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kode-torch")

        def build() -> TorchBackend:
            if n_threads:
                torch.set_num_threads(n_threads)
            target, draft = models()
            if draft is not None:
                _check_same_vocab(target.model, draft.model)
            if target.tokenizer is None:
                raise ModelError(f"no tokenizer for {target.name}")
            engine = TorchEngine(
                target.model,
                target.tokenizer,
                draft=None if draft is None else draft.model,
                name=target.name,
                n_ctx=n_ctx,
            )
            measured = curve if curve is not None else calibrate(engine.lm)
            return cls(
                engine, executor, curve=measured, draft_options=draft_options, owns_executor=True
            )

        try:
            return await asyncio.get_running_loop().run_in_executor(executor, build)
        except BaseException:
            executor.shutdown(wait=False)
            raise


async def load_torch_backend(
    model: str,
    draft: str | None = None,
    *,
    device: str | None = None,
    n_ctx: int = CONTEXT_SIZE,
    n_threads: int | None = None,
) -> Backend:
    """The factory's entry point: a ``TorchBackend`` for the ``model`` / ``draftModel``
    settings (``default``, ``small``, a GGUF path, a model directory or a hub id)."""
    return await TorchBackend.load(
        model, draft=draft, device=device, n_ctx=n_ctx, n_threads=n_threads
    )
