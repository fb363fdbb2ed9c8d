"""Remote backends: SGLang's native ``/generate`` and OpenAI-compatible ``/v1/completions``.

Both stream server-sent events over one shared ``httpx.AsyncClient`` per backend
(connections are reused between keystrokes; tests pass ``transport=``). A
generation is a task that reads the stream into a queue, so ``wait()`` works
without iterating, like the local backend's worker thread.

Cancelling a generation (or leaving ``async for`` early) closes its HTTP stream
and, for SGLang, also posts ``/abort_request {"rid": ...}``: SGLang notices a
closed stream only after a delay, and a superseded keystroke should free the
GPU at once. The abort is fired in the background with a short timeout; its
failure is logged, never raised.

Errors: 401/403 -> ``RemoteAuthError``, 429 -> ``RemoteBusyError``, other statuses
(5xx included) -> ``RemoteError`` naming the status, no byte within the timeout
-> ``RemoteTimeout``, a cut or garbled stream -> ``RemoteError``.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from typing import Any, ClassVar

import httpx
import msgspec
from kode.backends.base import (
    FinishReason,
    GenerationRequest,
    GenerationStats,
    SpeculationMethod,
    SpeculationStats,
    TokenChunk,
)
from kode.backends.chunks import ChunkQueue, drain
from kode.backends.errors import (
    BackendClosed,
    BackendError,
    RemoteError,
    RemoteTimeout,
    StreamError,
)
from kode.backends.remote.sse import (
    Payload,
    SSEEvent,
    aiter_events,
    decode_json,
    error_for_status,
)

log = logging.getLogger("kode.remote")

TokenCounter = Callable[[str], int]


def estimate_tokens(text: str) -> int:
    """A cheap token count for code when no tokenizer is at hand (about 3 chars a token)."""
    return len(text) // 3 + 1


# -- wire formats (unknown fields are ignored) ---------------------------------------


class _Finish(msgspec.Struct, frozen=True):
    type: str = ""
    message: str | None = None


class _Meta(msgspec.Struct, frozen=True):
    id: str = ""
    finish_reason: _Finish | str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    spec_verify_ct: int | None = None
    spec_num_proposed_drafts: int | None = None
    kode_worker: str | None = None  # the engine that generated (a ``kode serve`` extension)


class _SGLangOut(Payload, frozen=True):
    text: str = ""
    output_ids: list[int] = msgspec.field(default_factory=list)
    meta_info: _Meta | None = None


class _Choice(msgspec.Struct, frozen=True):
    text: str = ""
    index: int = 0
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct, frozen=True):
    cached_tokens: int | None = None


class _Usage(msgspec.Struct, frozen=True):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None


class _OpenAIChunk(Payload, frozen=True):
    choices: list[_Choice] = msgspec.field(default_factory=list)
    usage: _Usage | None = None


class _ErrorDoc(msgspec.Struct, frozen=True):
    error: Any = None
    message: Any = None
    detail: Any = None


_SGLANG_DECODER = msgspec.json.Decoder(_SGLangOut)
_OPENAI_DECODER = msgspec.json.Decoder(_OpenAIChunk)
_ERROR_DECODER = msgspec.json.Decoder(_ErrorDoc)


# -- one generation -------------------------------------------------------------------


class RemoteGeneration:
    """A streaming request in flight; iterate it for chunks, cancel it to stop it."""

    def __init__(self, backend: RemoteBackend, request: GenerationRequest) -> None:
        self.rid = uuid.uuid4().hex
        self._backend = backend
        self._request = request
        self._queue: ChunkQueue = asyncio.Queue()
        self._stats = GenerationStats()
        self._start = time.perf_counter()
        self.received_text = ""  # cumulative streams are diffed against it
        self._chunks = 0
        self.verify_ct: int | None = None  # SGLang's spec_verify_ct: target verify steps
        self.proposed: int | None = None
        self._finished = False  # the server said the generation ended
        self._sent = False  # the request may have reached the server
        self._cancel_requested = False
        self._ran = False
        self._task = asyncio.create_task(self._pump(), name=f"kode-remote-{self.rid[:8]}")
        self._task.add_done_callback(self._settle)

    @property
    def stats(self) -> GenerationStats:
        return self._stats

    async def __aiter__(self) -> AsyncGenerator[TokenChunk]:
        try:
            async with aclosing(drain(self._queue)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            # Leaving the loop early (break, error, task cancel) stops the request.
            self._request_cancel()

    async def cancel(self) -> None:
        self._request_cancel()
        await asyncio.wait({self._task})

    async def wait(self) -> GenerationStats:
        await asyncio.wait({self._task})
        return self._stats

    def _request_cancel(self) -> None:
        # Cancel once: a second cancel() would interrupt the task's own cleanup
        # (closing the stream) with another CancelledError.
        if not self._task.done() and not self._cancel_requested:
            self._cancel_requested = True
            self._task.cancel()

    # -- the reading task ------------------------------------------------------------

    def _settle(self, task: asyncio.Task[None]) -> None:
        """A task cancelled before it ran never reached its ``finally``: end it here."""
        if not self._ran:
            self._stats.finish_reason = FinishReason.CANCELLED
            self._queue.put_nowait(None)
            self._backend.forget(self)

    async def _pump(self) -> None:
        self._ran = True
        backend, stats = self._backend, self._stats
        server = backend.describe()
        try:
            path, body = backend.request_body(self._request, self.rid)
            self._sent = True
            async with backend.client.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    self._sent = False  # refused: nothing runs there
                    raise await _status_error(response, server)
                stats.worker = response.headers.get("x-kode-worker", "")
                async with aclosing(aiter_events(response.aiter_bytes())) as events:
                    async for event in events:
                        if event.done:
                            self._finished = True
                            break
                        backend.on_event(self, event)
            if not self._finished and stats.finish_reason is None:
                raise RemoteError(f"{server} closed the stream before the generation ended")
            self._finished = True
            if stats.finish_reason is None:
                stats.finish_reason = FinishReason.END
        except asyncio.CancelledError:
            stats.finish_reason = FinishReason.CANCELLED
            if not self._cancel_requested:
                raise
        except RemoteError as exc:
            self._fail(exc)
        except httpx.TimeoutException as exc:
            self._fail(
                RemoteTimeout(
                    f"{server} sent nothing for {backend.timeout_ms} ms ({type(exc).__name__})"
                )
            )
        except httpx.ConnectError as exc:
            self._fail(RemoteError(f"cannot connect to {server}: {exc}"))
        except httpx.HTTPError as exc:
            self._fail(RemoteError(f"{server}: {type(exc).__name__}: {exc}"))
        finally:
            self._finalize()
            if self._sent and not self._finished:
                backend.fire_abort(self.rid)
            self._queue.put_nowait(None)
            backend.forget(self)

    def _fail(self, exc: RemoteError) -> None:
        self._stats.finish_reason = FinishReason.ERROR
        self._backend.counters.errors += 1
        self._queue.put_nowait(exc)

    def _finalize(self) -> None:
        stats = self._stats
        stats.total_ms = (time.perf_counter() - self._start) * 1000.0
        if stats.completion_tokens == 0:
            stats.completion_tokens = self._chunks
        stats.evaluated_prompt_tokens = max(0, stats.prompt_tokens - stats.reused_prompt_tokens)
        if self.verify_ct:
            steps = self.verify_ct
            stats.decode_steps = steps
            stats.speculation = SpeculationStats(
                method=SpeculationMethod.REMOTE,
                steps=steps,
                drafted=self.proposed or 0,
                accepted=max(0, stats.completion_tokens - steps),
            )
        else:
            stats.decode_steps = stats.completion_tokens

    # -- called by the backend's event parser ---------------------------------------

    def emit(self, text: str, token_ids: Sequence[int] = ()) -> None:
        if not text and not token_ids:
            return
        if self._chunks == 0:
            self._stats.ttft_ms = (time.perf_counter() - self._start) * 1000.0
        self._chunks += 1
        self.received_text += text
        self._queue.put_nowait(TokenChunk(text, tuple(token_ids)))

    def finish(self, reason: FinishReason) -> None:
        self._stats.finish_reason = reason


async def _status_error(response: httpx.Response, server: str, limit: int = 4096) -> RemoteError:
    """The error for a non-200 answer, with the server's message (bounded) if it sent one."""
    status = response.status_code
    body = b""
    try:
        async for part in response.aiter_bytes():
            body += part
            if len(body) >= limit:
                break
    except httpx.HTTPError:
        pass
    message = _error_message(body[:limit])
    text = f"{server} answered HTTP {status}"
    return error_for_status(status, f"{text}: {message}" if message else text)


def _error_message(body: bytes) -> str:
    try:
        doc = _ERROR_DECODER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return body.decode("utf-8", errors="replace").strip()[:300]
    for value in (doc.error, doc.message, doc.detail):
        if isinstance(value, dict):
            value = value.get("message") or value.get("type")
        if isinstance(value, str) and value:
            return value[:300]
    return ""


# -- backends -------------------------------------------------------------------------


class RemoteCounters(msgspec.Struct):
    """Totals since the backend started (read by tests and ``kode serve``)."""

    generations: int = 0
    errors: int = 0
    aborts_sent: int = 0
    aborts_failed: int = 0

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.to_builtins(self)
        return out


class RemoteBackend:
    """What the SGLang and OpenAI backends share: client, auth, timeouts, aborts."""

    api: ClassVar[str] = ""
    health_path: ClassVar[str] = "/health"

    def __init__(
        self,
        url: str,
        *,
        api_key: str = "",
        model: str = "",
        timeout_ms: int = 5000,
        stop: Sequence[str] = (),
        count_tokens: TokenCounter | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        abort_timeout_s: float = 1.0,
    ) -> None:
        if not url:
            raise BackendError(f"{self.api}: no server URL")
        self.url = url.rstrip("/")
        self.model = model
        self.timeout_ms = timeout_ms
        self.stop = tuple(stop)
        self.abort_timeout_s = abort_timeout_s
        self.counters = RemoteCounters()
        self._count = count_tokens or estimate_tokens
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout_ms / 1000.0),
            transport=transport,
            limits=httpx.Limits(max_connections=100, max_keepalive_connections=20),
        )
        self._live: set[RemoteGeneration] = set()
        self._aborts: set[asyncio.Task[None]] = set()
        self._closed = False

    # -- Backend protocol -------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.api

    @property
    def model_name(self) -> str:
        return self.model or f"{self.api} at {self.url}"

    def count_tokens(self, text: str) -> int:
        return self._count(text)

    async def generate(self, request: GenerationRequest) -> RemoteGeneration:
        if self._closed:
            raise BackendClosed("backend is closed")
        if request.max_tokens < 1:
            raise BackendError("max_tokens must be at least 1")
        generation = RemoteGeneration(self, request)
        self._live.add(generation)
        self.counters.generations += 1
        return generation

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        for generation in list(self._live):
            await generation.cancel()
        if self._aborts:
            await asyncio.wait(set(self._aborts), timeout=self.abort_timeout_s + 0.5)
        await self.client.aclose()

    # -- health -----------------------------------------------------------------------

    async def health(self, timeout_s: float = 1.0) -> bool:
        """True if the server answers its health endpoint with 200 within ``timeout_s``."""
        try:
            response = await self.client.get(self.health_path, timeout=timeout_s)
        except httpx.HTTPError as exc:
            log.info("health probe of %s failed: %s", self.describe(), type(exc).__name__)
            return False
        if response.status_code != 200:
            log.info("health probe of %s: HTTP %d", self.describe(), response.status_code)
        return response.status_code == 200

    # -- for RemoteGeneration --------------------------------------------------------

    def describe(self) -> str:
        return f"{self.api} server {self.url}"

    def forget(self, generation: RemoteGeneration) -> None:
        self._live.discard(generation)

    def fire_abort(self, rid: str) -> None:
        """Tell the server to stop ``rid`` now (only servers with an abort endpoint)."""

    def request_body(self, request: GenerationRequest, rid: str) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def on_event(self, generation: RemoteGeneration, event: SSEEvent) -> None:
        raise NotImplementedError


class SGLangBackend(RemoteBackend):
    """SGLang's native API: ``POST /generate`` (SSE) and ``POST /abort_request``.

    ``text`` in SGLang's stream is cumulative unless the server runs with
    ``--incremental-streaming-output``; ``incremental=None`` (the default) assumes
    cumulative text and switches for good the first time a text does not extend the
    one before it (an incremental server's second chunk proves it).

    SGLang's router (sglang-router 0.3.2) has no ``/abort_request``: the first 404 turns
    the aborts off for this upstream, and closing the stream is the abort from then on
    (the router drops its connection to the worker, which stops the generation).
    """

    api = "sglang"
    health_path = "/health"

    def __init__(
        self,
        url: str,
        *,
        incremental: bool | None = None,
        skip_special_tokens: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(url, **kwargs)
        self.incremental = incremental
        self.skip_special_tokens = skip_special_tokens
        self.sends_aborts = True

    def request_body(self, request: GenerationRequest, rid: str) -> tuple[str, dict[str, Any]]:
        sampling: dict[str, Any] = {
            "max_new_tokens": request.max_tokens,
            "temperature": request.sampling.temperature,
            "top_p": request.sampling.top_p,
            "skip_special_tokens": self.skip_special_tokens,
        }
        if self.stop:
            sampling["stop"] = list(self.stop)
        body = {"text": request.prompt, "sampling_params": sampling, "stream": True, "rid": rid}
        return "/generate", body

    def on_event(self, generation: RemoteGeneration, event: SSEEvent) -> None:
        out = decode_json(event, _SGLANG_DECODER, self.describe())
        text = out.text
        seen = generation.received_text
        if self.incremental:
            delta = text
        elif text.startswith(seen):
            delta = text[len(seen) :]
        elif self.incremental is None:
            log.info("%s streams incremental text; treating it so from now on", self.describe())
            self.incremental = True
            delta = text
        else:
            raise StreamError(
                f"{self.describe()} sent a text that does not extend the previous one; "
                "is it running with --incremental-streaming-output?"
            )
        generation.emit(delta, out.output_ids)
        meta = out.meta_info
        if meta is None:
            return
        stats = generation.stats
        if meta.prompt_tokens is not None:
            stats.prompt_tokens = meta.prompt_tokens
        if meta.cached_tokens is not None:
            stats.reused_prompt_tokens = meta.cached_tokens
        if meta.completion_tokens is not None:
            stats.completion_tokens = meta.completion_tokens
        if meta.kode_worker:
            stats.worker = meta.kode_worker
        if meta.spec_verify_ct is not None:
            generation.verify_ct = meta.spec_verify_ct
        if meta.spec_num_proposed_drafts is not None:
            generation.proposed = meta.spec_num_proposed_drafts
        finish = meta.finish_reason
        if finish is None:
            return
        kind = finish if isinstance(finish, str) else finish.type
        if kind == "abort" or "ABORT" in kind:
            message = "" if isinstance(finish, str) else finish.message or ""
            raise RemoteError(f"{self.describe()} aborted the request: {message or kind}")
        generation.finish(
            FinishReason.LENGTH if kind == "length" or "LENGTH" in kind else FinishReason.END
        )

    def fire_abort(self, rid: str) -> None:
        if self.client.is_closed or not self.sends_aborts:
            return
        task = asyncio.get_running_loop().create_task(
            self._abort(rid), name=f"kode-abort-{rid[:8]}"
        )
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def _abort(self, rid: str) -> None:
        self.counters.aborts_sent += 1
        try:
            response = await self.client.post(
                "/abort_request", json={"rid": rid}, timeout=self.abort_timeout_s
            )
        except httpx.HTTPError as exc:
            self.counters.aborts_failed += 1
            log.warning("abort of %s at %s failed: %s", rid, self.url, type(exc).__name__)
            return
        if response.status_code == 404 and self.sends_aborts:
            self.sends_aborts = False
            log.info(
                "%s has no /abort_request (a router?): closing the stream is the abort",
                self.describe(),
            )
        if response.status_code != 200:
            self.counters.aborts_failed += 1
            if self.sends_aborts:
                log.warning("abort of %s at %s: HTTP %d", rid, self.url, response.status_code)


class OpenAIBackend(RemoteBackend):
    """OpenAI-compatible ``POST /v1/completions`` (vLLM, TGI, llama.cpp, SGLang, kode serve).

    There is no abort endpoint: closing the stream is the abort.
    """

    api = "openai"
    health_path = "/v1/models"

    def request_body(self, request: GenerationRequest, rid: str) -> tuple[str, dict[str, Any]]:
        body: dict[str, Any] = {
            "prompt": request.prompt,
            "max_tokens": request.max_tokens,
            "temperature": request.sampling.temperature,
            "top_p": request.sampling.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.model:
            body["model"] = self.model
        if self.stop:
            body["stop"] = list(self.stop)
        if request.sampling.seed is not None:
            body["seed"] = request.sampling.seed
        return "/v1/completions", body

    def on_event(self, generation: RemoteGeneration, event: SSEEvent) -> None:
        chunk = decode_json(event, _OPENAI_DECODER, self.describe())
        stats = generation.stats
        for choice in chunk.choices:
            if choice.index != 0:
                continue
            generation.emit(choice.text)
            reason = choice.finish_reason
            if reason == "length":
                generation.finish(FinishReason.LENGTH)
            elif reason == "abort":
                raise RemoteError(f"{self.describe()} aborted the request")
            elif reason is not None:
                generation.finish(FinishReason.END)
        usage = chunk.usage
        if usage is not None:
            if usage.prompt_tokens is not None:
                stats.prompt_tokens = usage.prompt_tokens
            if usage.completion_tokens is not None:
                stats.completion_tokens = usage.completion_tokens
            details = usage.prompt_tokens_details
            if details is not None and details.cached_tokens is not None:
                stats.reused_prompt_tokens = details.cached_tokens
