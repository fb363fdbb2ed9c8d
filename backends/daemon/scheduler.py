"""Which generations the shared engine runs, and when, for every window at once.

One model serves all windows. Its backend runs up to ``width`` generations at once
(``Concurrent``; llama.cpp decodes them in one batch, each in a KV slot of its own) and
background work alone; what matters is who runs and who waits. The rule, in full:

1. A keystroke's request (foreground) runs before any background work (reading a file
   ahead, preparing the cursor's window, a prefetch), whichever window sent either.
2. Keystrokes run together, up to ``width`` at once: one arriving while others run
   starts at once if there is room (its prompt is evaluated between the others'
   decoding steps, then it decodes in the same batch). Among waiting requests of one
   kind, the newest runs first: the user is at the newest keystroke, and older ones
   are most likely already stale.
3. Background work runs alone. A foreground request arriving while it runs pauses it:
   the engine stops it (within one decode step; what it evaluated stays in the KV
   memory) and, if it had not produced a token yet, puts it back in the queue.
   Background work (re)starts only after ``quiet_s`` without a keystroke of any window:
   between keystrokes a person types (~120 ms apart) it would only be paused again,
   and each pause costs the next keystroke a stop and a swap of KV states. A running
   foreground request is never interrupted by another window's.
4. Latest wins per document: a request replaces the waiting and running requests of
   the same window and document (a foreground one replaces background work too). It
   starts once the one it replaced has stopped (within one decode step), never beside
   it: that one's KV slot holds the document's evaluated prompt, which the new request
   reuses; in another slot it would evaluate it again.
5. A window that disconnects loses everything it asked for: its waiting requests are
   dropped and its running ones are stopped.

The scheduler is pure bookkeeping: it returns a ``Plan`` (what to start, stop, pause)
and the engine carries it out, so every rule above is tested without a model.

    >>> s = Scheduler(quiet_s=0.25, width=2)
    >>> [job.id for job in s.submit(EngineJob(1, window=1, background=True), now=0.0).start]
    [1]
    >>> plan = s.submit(EngineJob(2, window=2, background=False), now=1.0)
    >>> plan.pause.id, plan.start
    (1, ())
    >>> [job.id for job in s.finished(1, paused=True, now=1.01).start]   # the keystroke runs
    [2]
    >>> [job.id for job in s.submit(EngineJob(3, window=3, background=False), now=1.1).start]
    [3]
    >>> s.finished(2, now=1.4).start, s.finished(3, now=1.5)    # the read-ahead waits
    ((), Plan(start=(), stop=(), pause=None, wake_at=1.75))
    >>> [job.id for job in s.poke(now=1.75).start]                # then resumes
    [1]
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class EngineJob:
    """One generation a window asked for (``id`` unique within the engine)."""

    id: int
    window: int
    background: bool
    document: str = ""
    seq: int = 0  # arrival order, set by the scheduler
    abandoned: bool = False  # cancelled, replaced or its window gone: never resumed


@dataclass(frozen=True, slots=True)
class Plan:
    """What the engine must do now: ``stop`` these jobs (running ones are cancelled,
    waiting ones end as cancelled), ``pause`` the running background job, ``start`` these,
    and call ``poke`` at ``wake_at``."""

    start: tuple[EngineJob, ...] = ()
    stop: tuple[EngineJob, ...] = ()
    pause: EngineJob | None = None
    wake_at: float | None = None  # background work waits: ``poke`` again then


# Background work waits this long after the last keystroke of any window (the windows'
# own background preparation waits as long, ``completion.preparation.PREPARE_QUIET_S``).
QUIET_S = 0.25


@dataclass(slots=True)
class Scheduler:
    """The rules above; every method takes ``now`` (seconds, monotonic). ``width``: how
    many foreground jobs may run at once (the backend's ``Concurrent.width``)."""

    quiet_s: float = QUIET_S
    width: int = 1
    running: list[EngineJob] = field(default_factory=list)
    waiting: list[EngineJob] = field(default_factory=list)
    last_foreground: float = float("-inf")  # when a keystroke last arrived or ended
    _stopping: set[int] = field(default_factory=set)  # running jobs told to stop or pause
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    def submit(self, job: EngineJob, *, now: float) -> Plan:
        """A new request: queue it, replace what it supersedes, pause background work."""
        job.seq = next(self._seq)
        if not job.background:
            self.last_foreground = now
        stop = [old for old in self.waiting if self._replaces(job, old)]
        for old in stop:
            old.abandoned = True
        self.waiting = [old for old in self.waiting if not old.abandoned]
        self.waiting.append(job)
        pause = None
        for running in self.running:
            if running.id in self._stopping:
                continue
            if self._replaces(job, running):
                running.abandoned = True
                stop.append(running)
                self._stopping.add(running.id)
            elif running.background and not job.background:
                pause = running
                self._stopping.add(running.id)
        return self._next(now, stop=tuple(stop), pause=pause)

    def cancel(self, job_id: int, *, now: float) -> Plan:
        """The window cancelled ``job_id``."""
        return self._drop(lambda job: job.id == job_id, now)

    def disconnect(self, window: int, *, now: float) -> Plan:
        """``window`` is gone: drop what it waits for, stop what it runs."""
        return self._drop(lambda job: job.window == window, now)

    def poke(self, *, now: float) -> Plan:
        """Time passed (a ``wake_at``): start background work if it is quiet now."""
        return self._next(now)

    def finished(self, job_id: int, *, now: float, paused: bool = False) -> Plan:
        """A running job ended; ``paused``: it was paused before producing a token and
        goes back in the queue (unless it was abandoned meanwhile)."""
        found = [job for job in self.running if job.id == job_id]
        if not found:
            raise ValueError(f"job {job_id} is not running")
        job = found[0]
        self.running.remove(job)
        self._stopping.discard(job_id)
        if not job.background:
            self.last_foreground = now
        if paused and not job.abandoned:
            self.waiting.append(job)
        return self._next(now)

    def _drop(self, matches: Callable[[EngineJob], bool], now: float) -> Plan:
        stop = [job for job in self.waiting if matches(job)]
        self.waiting = [job for job in self.waiting if not matches(job)]
        for running in self.running:
            if matches(running) and not running.abandoned:
                stop.append(running)
                self._stopping.add(running.id)
        for job in stop:
            job.abandoned = True
        return self._next(now, stop=tuple(stop))

    def _follows(self, job: EngineJob) -> bool:
        """Whether a generation of ``job``'s window and document is still stopping
        (rule 4: ``job`` starts in the slot it leaves)."""
        return bool(job.document) and any(
            running.id in self._stopping
            and (running.window, running.document) == (job.window, job.document)
            for running in self.running
        )

    @staticmethod
    def _replaces(new: EngineJob, old: EngineJob) -> bool:
        if not new.document or (new.window, new.document) != (old.window, old.document):
            return False
        return not new.background or old.background

    def _next(
        self, now: float, stop: tuple[EngineJob, ...] = (), pause: EngineJob | None = None
    ) -> Plan:
        """The plan, starting the best waiting jobs while there is room: keystrokes up to
        ``width`` and never beside background work, background work alone and only once
        it has been quiet for ``quiet_s``."""
        start: list[EngineJob] = []
        wake_at = None
        while True:
            ready = [job for job in self.waiting if not self._follows(job)]
            if not ready:
                break
            best = max(ready, key=lambda job: (not job.background, job.seq))
            if best.background:
                if self.running:
                    break
                quiet_from = self.last_foreground + self.quiet_s
                if now < quiet_from:
                    wake_at = quiet_from
                    break
            elif len(self.running) >= self.width or any(j.background for j in self.running):
                break
            self.waiting.remove(best)
            self.running.append(best)
            start.append(best)
        return Plan(start=tuple(start), stop=stop, pause=pause, wake_at=wake_at)
