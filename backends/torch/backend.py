"""A local backend on PyTorch and transformers: one model, one KV cache, one worker thread.

The same shape as the llama.cpp backend (``backends/llama.py``): every torch call runs on
the backend's single worker thread; the worker checks the generation's cancel flag
before each forward (prompt chunks included), so a cancelled generation stops within
one step; the KV cache is kept between generations and reused for the longest common
token prefix (``CausalLM.prefill`` crops it to that prefix). Speculation (``none``,
``ngram``, ``auto``, ``draft``) runs through ``backends/torch_spec.py``; ``lookahead``
needs several KV sequences in one batch and is llama.cpp-only.

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
from typing import Any

import torch
from kode.backends.base import (
    Backend,
    FinishReason,
    GenerationRequest,
    SpeculationMethod,
)
from kode.backends.errors import BackendError, ContextOverflow, ModelError
from kode.backends.speculative import CostCurve
from kode.backends.torch.steppers import (
    CausalLM,
    DraftModelStepper,
    NgramStepper,
    Picker,
    PlainStepper,
    PrefillAborted,
    calibrate,
)
from kode.backends.worker import (
    BackendCounters,
    Job,
    NgramLearning,
    Stepper,
    WorkerGeneration,
    WorkerRun,
    run_job,
)
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase


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


@dataclass(frozen=True, slots=True)
class DraftOptions:
    """How the draft model drafts: at most ``max_draft`` tokens, stopping when its top
    probability falls below ``p_min``."""

    max_draft: int = 4
    p_min: float = 0.6


def _check_same_vocab(target: PreTrainedModel, draft: PreTrainedModel) -> None:
    t = target.config.get_text_config().vocab_size
    d = draft.config.get_text_config().vocab_size
    if t != d:
        raise ModelError(f"the draft model's vocabulary ({d}) differs from the target's ({t})")


class TorchBackend:
    """Local generation with transformers; ``await TorchBackend.load(ref)`` or, for models
    already in memory, ``await TorchBackend.create(model, tokenizer)``."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        executor: ThreadPoolExecutor,
        *,
        curve: CostCurve,
        draft: PreTrainedModel | None = None,
        draft_options: DraftOptions = DraftOptions(),
        name: str = "",
        n_ctx: int = 4096,
    ) -> None:
        self._lm = CausalLM(model)
        self._draft = None if draft is None else CausalLM(draft)
        self.draft_options = draft_options
        eos = model.generation_config.eos_token_id if model.generation_config else None
        self.vocab = Vocab(tokenizer, [eos] if isinstance(eos, int) else (eos or []))
        self._executor = executor
        self._name = name or str(model.config.name_or_path or model.config.model_type)
        self.n_ctx = n_ctx
        self._lock = asyncio.Lock()
        self._closed = False
        self.counters = BackendCounters()
        self.curve = curve
        self.learning = NgramLearning(curve)

    @classmethod
    async def create(
        cls,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        draft: PreTrainedModel | None = None,
        draft_options: DraftOptions = DraftOptions(),
        curve: CostCurve | None = None,
        name: str = "",
        n_ctx: int = 4096,
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
        draft_options: DraftOptions = DraftOptions(),
        device: str | None = None,
        n_ctx: int = 4096,
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
            measured = curve if curve is not None else calibrate(CausalLM(target.model))
            return cls(
                target.model,
                target.tokenizer,
                executor,
                curve=measured,
                draft=None if draft is None else draft.model,
                draft_options=draft_options,
                name=target.name,
                n_ctx=n_ctx,
            )

        try:
            return await asyncio.get_running_loop().run_in_executor(executor, build)
        except BaseException:
            executor.shutdown(wait=False)
            raise

    # -- Backend protocol -------------------------------------------------------------

    @property
    def name(self) -> str:
        return "torch"

    @property
    def model_name(self) -> str:
        return self._name

    def count_tokens(self, text: str) -> int:
        return len(self.vocab.tokenize(text))

    async def generate(self, request: GenerationRequest) -> WorkerGeneration:
        if self._closed:
            raise BackendError("backend is closed")
        if request.max_tokens < 1:
            raise BackendError("max_tokens must be at least 1")
        if request.speculation is SpeculationMethod.LOOKAHEAD:
            raise BackendError(
                "speculation 'lookahead' is llama.cpp-only (it decodes several KV sequences "
                "in one batch); the torch backend offers none, ngram, draft and auto"
            )
        if request.speculation is SpeculationMethod.DRAFT and self._draft is None:
            raise BackendError(
                "speculation 'draft' needs a draft model (setting draftModel) loaded with "
                "the target"
            )
        await self._lock.acquire()
        loop = asyncio.get_running_loop()
        job = Job(request, loop)
        try:
            done = loop.run_in_executor(self._executor, self._run, job)
        except BaseException:
            self._lock.release()
            raise

        def finished(_fut: asyncio.Future[None]) -> None:
            self._lock.release()

        done.add_done_callback(finished)
        return WorkerGeneration(job, done)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        async with self._lock:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._free)
        self._executor.shutdown(wait=True)

    def _free(self) -> None:
        cuda = self._lm.device.type == "cuda"
        self._lm.reset()
        if self._draft is not None:
            self._draft.reset()
        if cuda:
            torch.cuda.empty_cache()

    async def logit_gaps(self, prompt: str, tokens: Sequence[int]) -> list[float]:
        """Top-2 logit gap of the target before each of ``tokens`` after ``prompt`` (for
        judging where two greedy runs diverge: a small gap is a near tie)."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._executor, self._gaps, prompt, list(tokens))

    def _gaps(self, prompt: str, tokens: list[int]) -> list[float]:
        lm = self._lm
        _, first = lm.prefill(self.vocab.tokenize(prompt))
        rows = [first]
        if len(tokens) > 1:
            rows.extend(lm.forward(tokens[:-1]))
        gaps = []
        for row in rows[: len(tokens)]:
            top2 = torch.topk(row, 2).values
            gaps.append(float(top2[0] - top2[1]))
        return gaps

    # -- worker thread ------------------------------------------------------------------

    def _run(self, job: Job) -> None:
        run_job(job, _Run(self, job))


class _Run(WorkerRun):
    """One generation, executed on the worker thread."""

    def __init__(self, backend: TorchBackend, job: Job) -> None:
        super().__init__(job)
        self.backend = backend
        self.lm = backend._lm
        self.vocab = backend.vocab
        self.picker = Picker(job.request.sampling)
        self.detok = Detokenizer(self.vocab)
        self.calls_at_start = self.lm.calls

    def execute(self) -> None:
        req, stats, lm = self.job.request, self.stats, self.lm
        prompt = self.vocab.tokenize(req.prompt)
        stats.prompt_tokens = len(prompt)
        if not prompt:
            raise BackendError("empty prompt")
        if len(prompt) + req.max_tokens + 1 > self.backend.n_ctx:
            raise ContextOverflow(
                f"prompt ({len(prompt)} tokens) + max_tokens ({req.max_tokens}) exceeds the "
                f"context window ({self.backend.n_ctx})"
            )
        try:
            stats.reused_prompt_tokens, logits = lm.prefill(prompt, self.job.cancelled)
        except PrefillAborted as aborted:
            stats.reused_prompt_tokens = aborted.reused
            stats.evaluated_prompt_tokens = max(0, len(lm.tokens) - aborted.reused)
            self.finish(FinishReason.CANCELLED)
            return
        stats.evaluated_prompt_tokens = len(prompt) - stats.reused_prompt_tokens
        stats.prefill_ms = self.elapsed_ms()
        stepper = self._stepper(req)
        self.decode(self.picker.pick(logits), stepper, self.vocab.is_stop)

    def _stepper(self, req: GenerationRequest) -> Stepper:
        backend, method, lm, picker = self.backend, req.speculation, self.lm, self.picker
        if method is SpeculationMethod.NONE:
            return PlainStepper(lm, picker)
        if method is SpeculationMethod.DRAFT:
            assert backend._draft is not None  # checked in generate()
            opts = backend.draft_options
            return DraftModelStepper(
                lm, picker, backend._draft, max_draft=opts.max_draft, p_min=opts.p_min
            )
        learning = backend.learning
        sources = [self.vocab.tokenize(text, special=False) for text in req.draft_sources if text]
        auto = method is SpeculationMethod.AUTO
        return NgramStepper(
            lm,
            picker,
            learning.drafter_for(sources),
            learning.policy_for(auto),
            allow_plain=auto,
            method=str(method),
            tracker=learning.costs if auto else None,
        )

    def text_of(self, token: int) -> str:
        return self.detok.push(token)

    def text_tail(self) -> str:
        return self.detok.flush()

    def account(self) -> None:
        self.stats.total_ms = self.elapsed_ms()
        self.backend.counters.record(self.stats, self.lm.calls - self.calls_at_start)
        self.backend.learning.remember(self.generated)


async def load_torch_backend(
    model: str,
    draft: str | None = None,
    *,
    device: str | None = None,
    n_ctx: int = 4096,
    n_threads: int | None = None,
) -> Backend:
    """The factory's entry point: a ``TorchBackend`` for the ``model`` / ``draftModel``
    settings (``default``, ``small``, a GGUF path, a model directory or a hub id)."""
    return await TorchBackend.load(
        model, draft=draft, device=device, n_ctx=n_ctx, n_threads=n_threads
    )


TorchGeneration = WorkerGeneration  # the name callers used before the split
