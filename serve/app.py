"""The HTTP face of ``kode serve``: SGLang's native API and OpenAI's completions API.

Endpoints:

- ``POST /generate``: SGLang's request (``text``, ``sampling_params``, ``stream``,
  ``rid``) answered as SGLang does: SSE ``data: {json}`` events with cumulative
  ``text``, incremental ``output_ids`` and ``meta_info``, then ``data: [DONE]``;
- ``POST /abort_request``: ``{"rid": ...}`` (or ``"abort_all": true``), the caller's own;
- ``POST /v1/completions``: OpenAI text completions, streamed or not;
- ``GET /v1/models``;
- ``GET /health`` and ``GET /metrics`` (Prometheus text): no key needed;
- what SGLang's router asks of a worker (``/server_info``, ``/model_info``, ``/get_load``,
  ``/health_generate``): ``serve/worker_api.py``.

Kode extensions: a request may name its document (``"document": "<uri>"`` or the
``X-Kode-Document`` header) so that a newer request for it aborts the older one;
every generation answer carries ``X-Kode-Request-Id``; a named server's every answer
carries ``X-Kode-Worker``, and SGLang events' ``meta_info.kode_worker`` names the engine
that generated (this server's, or the upstream's as that upstream named it).

Prompt text is never logged unless the server runs with ``--log-requests``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from kode.backends.base import GenerationRequest, Sampling, SpeculationMethod
from kode.backends.errors import ServeError
from kode.backends.remote.clients import RemoteBackend
from kode.backends.worker import BackendCounters
from kode.serve.auth import ANONYMOUS, KeyRing
from kode.serve.metrics import CONTENT_TYPE, Counter, Gauge
from kode.serve.service import (
    CompletionService,
    Delta,
    Ended,
    EndReason,
    Failed,
    Job,
)
from kode.serve.worker_api import WorkerApi, WorkerHeader
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("kode.serve")

_MaxTokens = Annotated[int, msgspec.Meta(ge=1, le=8192)]
# Stop strings are checked at every token against the text so far: 70,000 of them in
# one request stalled the event loop (/health took 2.8 s for everyone). OpenAI allows
# 4; editors send 1 to 5.
MAX_STOPS = 32
_Stop = Annotated[str, msgspec.Meta(max_length=256)]
_Stops = _Stop | Annotated[list[_Stop], msgspec.Meta(max_length=MAX_STOPS)] | None
_Seed = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)] | None  # llama.cpp: uint32
_Id = Annotated[str, msgspec.Meta(max_length=256)] | None
_Uri = Annotated[str, msgspec.Meta(max_length=4096)] | None
_Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
_TopP = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]


class _SamplingIn(msgspec.Struct, frozen=True):
    max_new_tokens: _MaxTokens = 128
    temperature: _Temperature = 1.0
    top_p: _TopP = 1.0
    stop: _Stops = None
    skip_special_tokens: bool = True


class _GenerateIn(msgspec.Struct, frozen=True):
    text: str | list[str] | None = None
    input_ids: list[Any] | None = None
    sampling_params: _SamplingIn = msgspec.field(default_factory=_SamplingIn)
    stream: bool = False
    rid: _Id = None
    document: _Uri = None


class _AbortIn(msgspec.Struct, frozen=True):
    rid: str = ""
    abort_all: bool = False


class _StreamOptions(msgspec.Struct, frozen=True):
    include_usage: bool = False


class _CompletionIn(msgspec.Struct, frozen=True):
    prompt: str | list[str]
    model: str | None = None
    max_tokens: _MaxTokens = 16
    temperature: _Temperature = 1.0
    top_p: _TopP = 1.0
    stop: _Stops = None
    stream: bool = False
    stream_options: _StreamOptions | None = None
    seed: _Seed = None
    n: Annotated[int, msgspec.Meta(ge=1, le=128)] = 1  # only 1 is served (checked below)
    echo: bool = False
    suffix: str | None = None
    document: _Uri = None


@dataclass(frozen=True, slots=True)
class ServeConfig:
    """How the HTTP layer behaves."""

    keys: KeyRing | None = None  # None: no authentication (loopback only)
    max_request_bytes: int = 1 << 20
    log_requests: bool = False
    keepalive_s: float = 15.0
    name: str = ""  # X-Kode-Worker and meta_info.kode_worker ("": not named)
    context_tokens: int = 0  # what one generation may hold (reported in /server_info)


_ENDPOINTS = (
    "/generate",
    "/abort_request",
    "/v1/completions",
    "/v1/models",
    "/health",
    "/metrics",
    "/server_info",
    "/get_server_info",
    "/model_info",
    "/get_model_info",
    "/get_load",
    "/health_generate",
)
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_DONE = b"data: [DONE]\n\n"
_KEEPALIVE = b": keep-alive\n\n"
_encoder = msgspec.json.Encoder()


def _sse(payload: Any) -> bytes:
    return b"data: " + _encoder.encode(payload) + b"\n\n"


def _error(status: int, message: str, kind: str) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "code": status}}
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(body, status_code=status, headers=headers)


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _doc_tag(document: str | None) -> str:
    """A short, stable tag for a document in logs (its URI may be private)."""
    if not document:
        return "-"
    return hashlib.sha256(document.encode()).hexdigest()[:8]


def _decode(data: bytes, kind: type[Any]) -> Any:
    try:
        return msgspec.json.decode(data, type=kind)
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ServeError(400, f"bad request: {exc}") from None


def _sglang_out(job: Job, ids: tuple[int, ...], ended: Ended | None, worker: str) -> dict[str, Any]:
    stats = job.stats
    finish: dict[str, Any] | None = None
    meta: dict[str, Any] = {
        "id": job.rid,
        "finish_reason": None,
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "cached_tokens": stats.reused_prompt_tokens,
    }
    if stats.worker or worker:
        meta["kode_worker"] = stats.worker or worker
    if ended is not None:
        if ended.reason is EndReason.LENGTH:
            finish = {"type": "length", "length": job.request.max_tokens}
        elif ended.reason is EndReason.ABORT:
            finish = {"type": "abort", "message": ended.message}
        else:
            finish = {"type": "stop", "matched": ended.matched}
        meta["finish_reason"] = finish
        meta["e2e_latency"] = round(time.perf_counter() - job.started, 4)
        spec = stats.speculation
        if spec.method is not SpeculationMethod.NONE and spec.steps:
            meta["spec_verify_ct"] = spec.steps
    return {"text": job.text, "output_ids": list(ids), "meta_info": meta}


def _usage_of(job: Job) -> dict[str, Any]:
    stats = job.stats
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.reused_prompt_tokens},
    }


def _choice(text: str, finish: str | None) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}


class _Handlers:
    """The endpoints, one method each, over one ``CompletionService``."""

    def __init__(self, service: CompletionService, config: ServeConfig) -> None:
        self.service = service
        self.config = config
        # The engine's name when it is this server's own; an upstream names its own.
        self.engine = config.name if service.workers.lines is not None else ""

    def caller(self, request: Request) -> str:
        if self.config.keys is None:
            return ANONYMOUS
        name = self.config.keys.identify_header(request.headers.get("authorization"))
        if name is None:
            raise ServeError(401, "missing or invalid API key", "authentication_error")
        return name

    async def body_of(self, request: Request) -> bytes:
        limit = self.config.max_request_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise ServeError(413, f"request body over {limit} bytes")
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > limit:
                raise ServeError(413, f"request body over {limit} bytes")
        return bytes(body)

    def start(
        self,
        key: str,
        endpoint: str,
        prompt: str,
        request: GenerationRequest,
        *,
        rid: str | None,
        document: str | None,
        stop: tuple[str, ...],
    ) -> Job:
        job = self.service.start(key, request, rid=rid, document=document, stop=stop)
        log.info(
            "%s %s by %s: %d chars, max %d tokens, document %s",
            endpoint,
            job.rid,
            key,
            len(prompt),
            request.max_tokens,
            _doc_tag(document),
        )
        if self.config.log_requests:
            log.info("prompt of %s: %r", job.rid, prompt)
        return job

    async def watch_disconnect(self, receive: Receive, job: Job) -> None:
        while not job.done:
            message = await receive()
            if message["type"] == "http.disconnect":
                self.service.abort(
                    job.key, job.rid, cause="disconnect", message="client disconnected"
                )
                return

    async def events(
        self, request: Request, job: Job
    ) -> AsyncGenerator[Delta | Ended | Failed | None]:
        """The job's events; aborts the job if the response ends early or the client goes."""
        watcher = asyncio.create_task(self.watch_disconnect(request.receive, job))
        try:
            async with contextlib.aclosing(job.stream(self.config.keepalive_s)) as stream:
                async for event in stream:
                    yield event
        finally:
            watcher.cancel()
            if not job.done:
                self.service.abort(
                    job.key, job.rid, cause="disconnect", message="client disconnected"
                )

    # -- SGLang native ------------------------------------------------------------------

    async def generate(self, request: Request) -> Response:
        key = self.caller(request)
        spec: _GenerateIn = _decode(await self.body_of(request), _GenerateIn)
        if spec.input_ids is not None or spec.text is None:
            raise ServeError(400, "send the prompt as 'text' (input_ids are not supported)")
        if not isinstance(spec.text, str):
            raise ServeError(400, "batches are not supported: send one 'text' per request")
        sp = spec.sampling_params
        gen = GenerationRequest(spec.text, sp.max_new_tokens, Sampling(sp.temperature, sp.top_p))
        document = spec.document or request.headers.get("x-kode-document")
        job = self.start(
            key, "/generate", spec.text, gen, rid=spec.rid, document=document, stop=_stops(sp.stop)
        )
        headers = {"X-Kode-Request-Id": job.rid}
        if spec.stream:
            return StreamingResponse(
                self.sglang_stream(request, job),
                media_type="text/event-stream",
                headers={**_SSE_HEADERS, **headers},
            )
        ids: list[int] = []
        async with contextlib.aclosing(self.events(request, job)) as stream:
            async for event in stream:
                if isinstance(event, Delta):
                    ids.extend(event.token_ids)
                elif isinstance(event, Failed):
                    return _error(event.status, event.message, "server_error")
                elif isinstance(event, Ended):
                    out = _sglang_out(job, tuple(ids), event, self.engine)
                    return JSONResponse(out, headers=headers)
        return _error(500, "the generation ended without a result", "server_error")

    async def sglang_stream(self, request: Request, job: Job) -> AsyncGenerator[bytes]:
        async with contextlib.aclosing(self.events(request, job)) as stream:
            async for event in stream:
                if event is None:
                    yield _KEEPALIVE
                elif isinstance(event, Delta):
                    yield _sse(_sglang_out(job, event.token_ids, None, self.engine))
                elif isinstance(event, Ended):
                    yield _sse(_sglang_out(job, (), event, self.engine))
                else:
                    yield _sse({"error": {"message": event.message, "code": event.status}})
        yield _DONE

    async def abort_request(self, request: Request) -> Response:
        key = self.caller(request)
        spec: _AbortIn = _decode(await self.body_of(request), _AbortIn)
        count = (
            self.service.abort_all(key)
            if spec.abort_all
            else int(self.service.abort(key, spec.rid))
        )
        return JSONResponse({"aborted": count})

    # -- OpenAI -------------------------------------------------------------------------

    async def completions(self, request: Request) -> Response:
        key = self.caller(request)
        spec: _CompletionIn = _decode(await self.body_of(request), _CompletionIn)
        prompt = spec.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise ServeError(400, "send exactly one prompt per request")
            prompt = prompt[0]
        if spec.n != 1 or spec.echo or spec.suffix is not None:
            raise ServeError(400, "n > 1, echo and suffix are not supported")
        gen = GenerationRequest(
            prompt, spec.max_tokens, Sampling(spec.temperature, spec.top_p, spec.seed)
        )
        document = spec.document or request.headers.get("x-kode-document")
        job = self.start(
            key, "/v1/completions", prompt, gen, rid=None, document=document, stop=_stops(spec.stop)
        )
        model = spec.model or self.service.workers.model_name
        head = {
            "id": f"cmpl-{job.rid}",
            "object": "text_completion",
            "created": int(job.created),
            "model": model,
        }
        headers = {"X-Kode-Request-Id": job.rid}
        if spec.stream:
            usage = spec.stream_options is not None and spec.stream_options.include_usage
            return StreamingResponse(
                self.openai_stream(request, job, head, usage),
                media_type="text/event-stream",
                headers={**_SSE_HEADERS, **headers},
            )
        async with contextlib.aclosing(self.events(request, job)) as stream:
            async for event in stream:
                if isinstance(event, Failed):
                    return _error(event.status, event.message, "server_error")
                if isinstance(event, Ended):
                    choice = {
                        "text": job.text,
                        "index": 0,
                        "logprobs": None,
                        "finish_reason": event.reason,
                    }
                    body = {**head, "choices": [choice], "usage": _usage_of(job)}
                    return JSONResponse(body, headers=headers)
        return _error(500, "the generation ended without a result", "server_error")

    async def openai_stream(
        self, request: Request, job: Job, head: dict[str, Any], usage: bool
    ) -> AsyncGenerator[bytes]:
        async with contextlib.aclosing(self.events(request, job)) as stream:
            async for event in stream:
                if event is None:
                    yield _KEEPALIVE
                elif isinstance(event, Delta):
                    if event.text:
                        yield _sse({**head, "choices": [_choice(event.text, None)]})
                elif isinstance(event, Ended):
                    yield _sse({**head, "choices": [_choice("", event.reason)]})
                    if usage:
                        yield _sse({**head, "choices": [], "usage": _usage_of(job)})
                else:
                    kind = "invalid_request_error" if event.status == 400 else "server_error"
                    error = {"message": event.message, "type": kind, "code": event.status}
                    yield _sse({"error": error})
        yield _DONE

    # -- the rest -----------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        self.caller(request)
        name = self.service.workers.model_name
        return JSONResponse(
            {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "kode"}]}
        )

    async def health(self, request: Request) -> Response:
        ok = await self.service.workers.healthy()
        return JSONResponse(
            {"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503
        )

    async def metrics_text(self, request: Request) -> Response:
        return Response(
            self.service.metrics.render(_backend_families(self.service)), media_type=CONTENT_TYPE
        )

    async def refused(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServeError)
        return _error(exc.status, str(exc), exc.kind)

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            running = len(self.service.jobs)
            await self.service.aclose()
            log.info("shut down; requests aborted: %d", running)


def build_app(service: CompletionService, config: ServeConfig) -> Starlette:
    """The starlette application over ``service``."""
    h = _Handlers(service, config)
    routes = [
        Route("/generate", h.generate, methods=["POST", "PUT"]),
        Route("/abort_request", h.abort_request, methods=["POST"]),
        Route("/v1/completions", h.completions, methods=["POST"]),
        Route("/v1/models", h.models, methods=["GET"]),
        Route("/health", h.health, methods=["GET"]),
        Route("/metrics", h.metrics_text, methods=["GET"]),
        *WorkerApi(service, config.name, config.context_tokens, h.caller).routes(),
    ]
    middleware = [Middleware(_CountRequests, counter=service.metrics.requests)]
    if config.name:
        middleware.append(Middleware(WorkerHeader, name=config.name))
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers={ServeError: h.refused},
        lifespan=h.lifespan,
    )


def _backend_families(service: CompletionService) -> list[Counter]:
    """Per-backend figures: jobs assigned now, and the local engine's own counters."""
    busy = Gauge("kode_worker_jobs", "Jobs assigned to each backend now.", ("worker",))
    waiting = Gauge(
        "kode_worker_waiting", "Jobs waiting for a serial (local) backend.", ("worker",)
    )
    generations = Counter(
        "kode_backend_generations_total", "Generations the backend ran.", ("worker",)
    )
    cancelled = Counter(
        "kode_backend_cancelled_total", "Generations the backend stopped early.", ("worker",)
    )
    after_cancel = Counter(
        "kode_backend_steps_after_cancel_total",
        "Decode steps that began after a cancel was requested.",
        ("worker",),
    )
    for index, backend in enumerate(service.workers.backends):
        worker = backend.url if isinstance(backend, RemoteBackend) else str(index)
        busy.set(worker, to=service.workers.busy[index])
        if service.workers.lines is not None:
            waiting.set(worker, to=len(service.workers.lines[index]))
        counters = backend.counters
        generations.inc(worker, by=counters.generations)
        if isinstance(counters, BackendCounters):  # a local engine sees its steps
            cancelled.inc(worker, by=counters.cancelled)
            after_cancel.inc(worker, by=counters.steps_after_cancel)
    return [busy, waiting, generations, cancelled, after_cancel]


class _CountRequests:
    """ASGI middleware counting answers by endpoint and status."""

    def __init__(self, app: ASGIApp, counter: Counter) -> None:
        self.app = app
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = path if path in _ENDPOINTS else "other"

        async def counting(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.counter.inc(endpoint, str(message["status"]))
            await send(message)

        await self.app(scope, receive, counting)
