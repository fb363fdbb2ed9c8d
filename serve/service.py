"""Requests become jobs: limits, latest-wins, aborts, and the backends behind them.

A ``Job`` is one accepted generation request. It runs as its own asyncio task (not
inside the HTTP response), so however the response ends (finished, client gone,
superseded, aborted) the task releases the backend generation in its ``finally``
and the metrics only count a generation as gone once the backend has let go of it.

Rules, per API key (the caller's name):

- at most ``max_per_key`` jobs in flight (queued or running), else ``Busy`` (429);
- latest wins per document: a request naming a document aborts that key's older
  request for the same document, on the local engine or upstream;
- ``abort(key, rid)`` aborts one job, and only the caller's own.

Behind the service: ``Workers``, one local llama.cpp backend or several upstream SGLang
workers, picked round robin or least busy. A local backend has one context, so its
requests wait in a ``Line``, first come first served, except that a request which
supersedes a waiting one takes that one's place: a user who keeps typing keeps their
turn instead of going to the back at every keystroke.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from kode.backends.base import Backend, FinishReason, GenerationRequest, GenerationStats
from kode.backends.errors import Busy, ContextOverflow, KodeError, RemoteError, ServeError
from kode.backends.latest import Latest
from kode.backends.stop_strings import find_stop, held_back
from kode.serve.metrics import Metrics

log = logging.getLogger("kode.serve")

KEEPALIVE_S = 15.0  # a comment line this often while a request waits (proxies drop idle streams)


class Policy(enum.StrEnum):
    ROUND_ROBIN = "round-robin"
    LEAST_BUSY = "least-busy"


class Line:
    """One generation at a time on a backend, in order of arrival.

    ``join(job, replacing=older)`` puts ``job`` where ``older`` waited (if it still
    waits); ``wait_turn`` returns when the job is first and the backend free;
    ``leave`` frees the backend (or the place) again.
    """

    def __init__(self) -> None:
        self._waiting: list[Job] = []
        self._turns: dict[Job, asyncio.Future[None]] = {}
        self.holder: Job | None = None

    def __len__(self) -> int:
        return len(self._waiting)

    def join(self, job: Job, replacing: Job | None = None) -> None:
        self._turns[job] = asyncio.get_running_loop().create_future()
        if replacing is not None and replacing in self._waiting:
            self._waiting[self._waiting.index(replacing)] = job
            self._turns.pop(replacing, None)
        else:
            self._waiting.append(job)
        self._advance()

    async def wait_turn(self, job: Job) -> None:
        await self._turns[job]

    def leave(self, job: Job) -> None:
        if job in self._waiting:
            self._waiting.remove(job)
        self._turns.pop(job, None)
        if self.holder is job:
            self.holder = None
        self._advance()

    def _advance(self) -> None:
        if self.holder is None and self._waiting:
            self.holder = self._waiting.pop(0)
            self._turns[self.holder].set_result(None)


class Workers:
    """The backends that generate: one local engine, or upstream servers.

    ``serial`` backends run one generation at a time (a local llama.cpp context): their
    requests wait in a ``Line``. Upstream servers batch concurrent requests themselves.
    """

    def __init__(
        self,
        backends: Sequence[Backend],
        policy: Policy = Policy.LEAST_BUSY,
        *,
        serial: bool = False,
    ) -> None:
        if not backends:
            raise ValueError("at least one backend")
        self.backends = list(backends)
        self.policy = policy
        self.busy = [0] * len(self.backends)
        self.lines = [Line() for _ in self.backends] if serial else None
        self._next = 0

    @property
    def model_name(self) -> str:
        return self.backends[0].model_name

    def acquire(self) -> int:
        """Index of the backend for the next job (counted busy until ``release``)."""
        n = len(self.backends)
        if self.policy is Policy.ROUND_ROBIN or n == 1:
            index = self._next % n
            self._next += 1
        else:
            start = self._next % n  # rotate ties so equal loads still spread
            index = min(range(n), key=lambda i: (self.busy[i], (i - start) % n))
            self._next += 1
        self.busy[index] += 1
        return index

    def release(self, index: int) -> None:
        self.busy[index] -= 1

    async def healthy(self, timeout_s: float = 1.0) -> bool:
        """True if at least one backend can serve (remote ones are probed)."""
        results = await asyncio.gather(*(b.health(timeout_s) for b in self.backends))
        return any(results)

    async def aclose(self) -> None:
        for backend in self.backends:
            await backend.aclose()


# -- what a job reports ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Delta:
    """New text (and the token ids behind it, when the backend has them)."""

    text: str
    token_ids: tuple[int, ...] = ()


class EndReason(enum.StrEnum):
    """Why a job ended, in the words of the SGLang and OpenAI APIs."""

    STOP = "stop"  # a stop string or the end of generation
    LENGTH = "length"  # max_tokens reached
    ABORT = "abort"  # aborted by the client or the server


@dataclass(frozen=True, slots=True)
class Ended:
    """The job ended, and why."""

    reason: EndReason
    matched: str | None = None  # the stop string that ended it
    message: str = ""  # why it was aborted


@dataclass(frozen=True, slots=True)
class Failed:
    """The backend failed; ``status`` is the HTTP status it maps to."""

    message: str
    status: int


Event = Delta | Ended | Failed


@dataclass(eq=False)
class Job:
    """One accepted generation request."""

    key: str
    rid: str
    document: str | None
    request: GenerationRequest
    stop: tuple[str, ...]
    created: float = field(default_factory=time.time)
    started: float = field(default_factory=time.perf_counter)
    text: str = ""  # text sent so far
    stats: GenerationStats = field(default_factory=GenerationStats)
    first_text_at: float | None = None
    abort_cause: str | None = None
    abort_message: str = ""
    ended: Ended | None = None
    counted: bool = True  # counts against the key's concurrency limit
    ran: bool = False  # a backend generation was started for it
    worker: int = -1  # index of the backend it runs on
    events: asyncio.Queue[Event | None] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None

    @property
    def done(self) -> bool:
        return self.task is None or self.task.done()

    def abort(self, cause: str, message: str) -> None:
        """Stop this job (its task releases the backend generation)."""
        if self.done or self.abort_cause is not None:
            return
        self.abort_cause, self.abort_message = cause, message
        assert self.task is not None
        self.task.cancel()

    async def stream(self, keepalive_s: float = KEEPALIVE_S) -> AsyncGenerator[Event | None]:
        """The job's events; ``None`` now and then while nothing happens (send a keep-alive)."""
        getter: asyncio.Task[Event | None] | None = None
        try:
            while True:
                if getter is None:
                    getter = asyncio.ensure_future(self.events.get())
                finished, _ = await asyncio.wait({getter}, timeout=keepalive_s)
                if not finished:
                    yield None
                    continue
                event = getter.result()
                getter = None
                if event is None:
                    return
                yield event
        finally:
            if getter is not None:
                getter.cancel()


class CompletionService:
    """Jobs over ``Workers``, with per-key limits and latest-wins per document."""

    def __init__(
        self,
        workers: Workers,
        metrics: Metrics | None = None,
        *,
        max_per_key: int = 4,
    ) -> None:
        self.workers = workers
        self.metrics = metrics if metrics is not None else Metrics()
        self.max_per_key = max_per_key
        self._jobs: dict[tuple[str, str], Job] = {}  # (key, rid)
        self._latest: Latest[tuple[str, str], Job] = Latest()  # per (key, document)
        self._per_key: dict[str, int] = {}
        self._closed = False

    @property
    def jobs(self) -> list[Job]:
        return list(self._jobs.values())

    def start(
        self,
        key: str,
        request: GenerationRequest,
        *,
        rid: str | None = None,
        document: str | None = None,
        stop: Sequence[str] = (),
    ) -> Job:
        """Accept a request and start its job; raises ``ServeError`` to refuse it."""
        if self._closed:
            raise ServeError(503, "the server is shutting down", "server_error")
        rid = rid or uuid.uuid4().hex
        if (key, rid) in self._jobs:
            raise ServeError(400, f"request id {rid!r} is already in use")
        older = self._latest.current((key, document)) if document else None
        if older is not None:
            self._abort(older, "superseded", "superseded by a newer request for the document")
        if self._per_key.get(key, 0) >= self.max_per_key:
            raise Busy(f"at most {self.max_per_key} concurrent requests per API key")
        job = Job(key, rid, document or None, request, tuple(s for s in stop if s))
        self._jobs[(key, rid)] = job
        if document:
            self._latest.claim((key, document), job)
        self._per_key[key] = self._per_key.get(key, 0) + 1
        self.metrics.jobs_in_flight.inc()
        index = self.workers.acquire()
        lines = self.workers.lines
        if lines is not None:
            replacing = older if older is not None and older.worker == index else None
            lines[index].join(job, replacing)
        job.worker = index
        job.task = asyncio.create_task(self._run(job, index), name=f"kode-job-{rid[:8]}")
        # Bookkeeping runs when the task is done, even if it was cancelled (superseded)
        # before it ever ran and so never reached a ``finally`` of its own.
        job.task.add_done_callback(lambda _task: self._settle(job, index))
        return job

    def abort(
        self,
        key: str,
        rid: str,
        *,
        cause: str = "client_abort",
        message: str = "aborted by request",
    ) -> bool:
        """Abort the caller's job ``rid``; False if there is none in flight."""
        job = self._jobs.get((key, rid))
        if job is None or job.done:
            return False
        self._abort(job, cause, message)
        return True

    def abort_all(self, key: str) -> int:
        jobs = [job for (owner, _), job in self._jobs.items() if owner == key]
        for job in jobs:
            self._abort(job, "client_abort", "aborted by request")
        return len(jobs)

    def _abort(self, job: Job, cause: str, message: str) -> None:
        self._uncount(job)  # on its way out (or done, its bookkeeping pending)
        job.abort(cause, message)

    def _uncount(self, job: Job) -> None:
        if job.counted:
            job.counted = False
            self._per_key[job.key] -= 1
            if not self._per_key[job.key]:
                del self._per_key[job.key]

    async def aclose(self) -> None:
        self._closed = True
        jobs = list(self._jobs.values())
        for job in jobs:
            self._abort(job, "shutdown", "the server is shutting down")
        tasks = [job.task for job in jobs if job.task is not None]
        if tasks:
            await asyncio.wait(tasks)
            await asyncio.sleep(0)  # let their done callbacks settle them
        await self.workers.aclose()

    # -- the job task -------------------------------------------------------------------

    async def _run(self, job: Job, index: int) -> None:
        metrics = self.metrics
        backend = self.workers.backends[index]
        generation = None
        raw = ""
        ids: list[int] = []
        lines = self.workers.lines
        try:
            try:
                if lines is not None:
                    await lines[index].wait_turn(job)
                generation = await backend.generate(job.request)
                job.stats = generation.stats
                metrics.active.inc()
                metrics.started.inc()
                async for chunk in generation:
                    raw += chunk.text
                    ids.extend(chunk.token_ids)
                    hit = find_stop(raw, job.stop, len(job.text))
                    if hit is not None:
                        self._emit(job, raw[: hit[0]], ids)
                        job.ended = Ended(EndReason.STOP, matched=hit[1])
                        break
                    self._emit(job, raw[: len(raw) - held_back(raw, job.stop)], ids)
                else:
                    self._emit(job, raw, ids)
                    length = generation.stats.finish_reason is FinishReason.LENGTH
                    job.ended = Ended(EndReason.LENGTH if length else EndReason.STOP)
            except asyncio.CancelledError:
                job.ended = Ended(EndReason.ABORT, message=job.abort_message or "aborted")
                if job.abort_cause is None:  # not ours: let it propagate after cleanup
                    job.abort_cause = "shutdown"
                    raise
            except ContextOverflow as exc:
                job.events.put_nowait(Failed(str(exc), 400))
            except RemoteError as exc:
                job.events.put_nowait(Failed(str(exc), 502))
            except KodeError as exc:
                job.events.put_nowait(Failed(str(exc), 500))
            except Exception as exc:  # reported to the client, logged with its traceback
                log.exception("job %s failed", job.rid)
                job.events.put_nowait(Failed(f"internal error: {type(exc).__name__}", 500))
            finally:
                if generation is not None:
                    await generation.cancel()  # returns once the backend let go of it
                    metrics.active.dec()
        finally:
            job.ran = generation is not None

    def _settle(self, job: Job, index: int) -> None:
        """Account for a finished job and tell its reader (the task's done callback)."""
        if job.ended is None and job.abort_cause is not None:
            job.ended = Ended(EndReason.ABORT, message=job.abort_message or "aborted")
        self._account(job, job.ran)
        if self.workers.lines is not None:
            self.workers.lines[index].leave(job)
        self.workers.release(index)
        self._forget(job)
        if job.ended is not None:
            job.events.put_nowait(job.ended)
        job.events.put_nowait(None)

    def _emit(self, job: Job, upto: str, ids: list[int]) -> None:
        """Send ``upto`` (which extends what was sent) and the pending token ids."""
        delta = upto[len(job.text) :]
        if not delta and not ids:
            return
        if delta and job.first_text_at is None:
            job.first_text_at = time.perf_counter()
            self.metrics.ttft.observe(job.first_text_at - job.started)
        job.text += delta
        job.events.put_nowait(Delta(delta, tuple(ids)))
        ids.clear()

    def _account(self, job: Job, ran: bool) -> None:
        metrics, stats, ended = self.metrics, job.stats, job.ended
        metrics.jobs_in_flight.dec()
        if ran:
            metrics.prompt_tokens.inc(by=stats.prompt_tokens)
            metrics.cached_tokens.inc(by=stats.reused_prompt_tokens)
            metrics.completion_tokens.inc(by=stats.completion_tokens)
        if job.abort_cause is not None:
            metrics.aborted.inc(job.abort_cause)
            metrics.finished.inc("abort")
            if ran:
                metrics.aborted_tokens.inc(by=stats.completion_tokens)
        elif ended is None:
            metrics.finished.inc("error")
        else:
            metrics.finished.inc(ended.reason)
            metrics.latency.observe(time.perf_counter() - job.started)

    def _forget(self, job: Job) -> None:
        self._uncount(job)
        if self._jobs.get((job.key, job.rid)) is job:
            del self._jobs[(job.key, job.rid)]
        if job.document:
            self._latest.release((job.key, job.document), job)
