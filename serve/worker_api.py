"""What SGLang's router asks of a worker, answered by ``kode serve``.

``python -m sglang_router.launch_router --worker-urls ...`` (sglang-router 0.3.2, read
from its source and watched on the wire) treats a URL as an SGLang worker once it
answers these; ``kode serve`` in local-engine mode answers them, so it can stand where
an SGLang GPU worker stands (docs/team-server.md):

- ``GET /health``: probed before registration and then every
  ``--health-check-interval-secs``; a failure count marks the worker unhealthy;
- ``GET /server_info`` (then the older ``/get_server_info``): ``model_path``,
  ``dp_size`` and the limits, read once at registration;
- ``GET /model_info`` (then ``/get_model_info``): ``model_path``, ``is_generation``;
- ``GET /get_load``: one entry per data-parallel rank with ``num_tokens``, polled every
  30 s by the router's load monitor (``power_of_two`` routes by it);
- ``GET /health_generate``: SGLang generates one token to prove the engine works; so
  does Kode. The router forwards its own ``/health_generate`` here. It spends the
  engine's time, so it takes a key where the server has keys; the others need none
  (the router sends no key unless it is given one, like ``/health`` and ``/metrics``).

What the router forwards of a request: ``POST /generate`` re-serialized from its own
typed struct (``rid``, ``text``, ``sampling_params``, ``stream`` survive; Kode's
``document`` does not), its SSE answer streamed back unchanged, headers included. It has
no ``/abort_request``: a client that stops reading closes the router's stream, the
router drops its connection to the worker, and the worker aborts the generation as a
disconnect (``kode_generations_aborted_total{cause="disconnect"}``).

Every answer of a named server carries ``X-Kode-Worker: NAME``, and a generation's
``meta_info.kode_worker`` says which engine made it, through a router and a ``kode
serve`` in front of it, so that tests and ``kode bench load --through-router`` can see
where each keystroke ran.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from kode.backends.base import GenerationRequest, Sampling
from kode.backends.defaults import KODE_VERSION
from kode.backends.errors import ServeError
from kode.serve.service import CompletionService, Ended, Failed
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

WORKER_HEADER = "X-Kode-Worker"
# The key /health_generate's one-token generation runs under: its own, so that a busy
# user's concurrency limit never refuses a health check (and the reverse).
HEALTH_KEY = "kode-health-generate"
HEALTH_PROMPT = "def add(a, b):\n    return"
HEALTH_TIMEOUT_S = 30.0  # a serial engine answers it after the generations before it


class WorkerApi:
    """The worker endpoints over one ``CompletionService`` (see the module docstring)."""

    def __init__(
        self,
        service: CompletionService,
        name: str,
        context_tokens: int,
        authorize: Callable[[Request], str],
    ) -> None:
        self.service = service
        self.name = name
        self.context_tokens = context_tokens
        self.authorize = authorize  # raises ServeError(401) for a missing or wrong key

    @property
    def serial(self) -> bool:
        return self.service.workers.lines is not None

    def routes(self) -> list[Route]:
        return [
            Route("/server_info", self.server_info, methods=["GET"]),
            Route("/get_server_info", self.server_info, methods=["GET"]),
            Route("/model_info", self.model_info, methods=["GET"]),
            Route("/get_model_info", self.model_info, methods=["GET"]),
            Route("/get_load", self.load, methods=["GET"]),
            Route("/health_generate", self.health_generate, methods=["GET"]),
        ]

    async def server_info(self, request: Request) -> Response:
        workers = self.service.workers
        return JSONResponse(
            {
                "model_path": workers.model_name,
                "served_model_name": workers.model_name,
                "version": KODE_VERSION,
                "dp_size": 1,
                "tp_size": 1,
                # A local engine runs one generation at a time; upstreams batch their own.
                "max_running_requests": len(workers.backends) if self.serial else None,
                "max_total_num_tokens": self.context_tokens or None,
                "kode_worker": self.name,
            }
        )

    async def model_info(self, request: Request) -> Response:
        name = self.service.workers.model_name
        return JSONResponse(
            {
                "model_path": name,
                "tokenizer_path": None,
                "is_generation": True,
                "served_model_name": name,
            }
        )

    async def load(self, request: Request) -> Response:
        """SGLang's shape: one entry per data-parallel rank (Kode has one)."""
        jobs = self.service.jobs
        waiting = sum(len(line) for line in self.service.workers.lines or ())
        tokens = sum(job.stats.prompt_tokens + job.stats.completion_tokens for job in jobs)
        return JSONResponse(
            [
                {
                    "dp_rank": 0,
                    "num_reqs": len(jobs),
                    "num_waiting_reqs": waiting,
                    "num_tokens": tokens,
                }
            ]
        )

    async def health_generate(self, request: Request) -> Response:
        """One greedy token through the same queue as everyone's requests."""
        self.authorize(request)
        try:
            job = self.service.start(
                HEALTH_KEY, GenerationRequest(HEALTH_PROMPT, 1, Sampling(temperature=0.0))
            )
        except ServeError as exc:
            return JSONResponse({"status": "unavailable", "error": str(exc)}, status_code=503)
        problem = "no answer"
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                async with contextlib.aclosing(job.stream(HEALTH_TIMEOUT_S)) as events:
                    async for event in events:
                        if isinstance(event, Failed):
                            problem = event.message
                        elif isinstance(event, Ended):
                            return JSONResponse({"status": "ok"})
        except TimeoutError:
            problem = f"no token within {HEALTH_TIMEOUT_S:.0f} s"
        finally:
            self.service.abort(HEALTH_KEY, job.rid, cause="client_abort")  # if still running
        return JSONResponse({"status": "unavailable", "error": problem}, status_code=503)


class WorkerHeader:
    """ASGI middleware: every HTTP answer names the server (``X-Kode-Worker``)."""

    def __init__(self, app: ASGIApp, name: str) -> None:
        self.app = app
        self.header = (WORKER_HEADER.lower().encode(), name.encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def naming(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, naming)
