"""Which generation the shared engine runs next, for every window at once.

One model and one KV cache serve all windows, so generations run one at a time; what
matters is the order. The rule, in full:

1. A keystroke's request (foreground) runs before any background work (reading a file
   ahead, preparing the cursor's window, a prefetch), whichever window sent either.
2. Among waiting requests of one kind, the newest runs first: the user is at the newest
   keystroke, and older ones are most likely already stale.
3. A foreground request arriving while background work runs pauses it: the engine stops
   it (within one decode step; what it evaluated stays in the KV memory) and, if it had
   not produced a token yet, puts it back in the queue. Background work (re)starts only
   after ``quiet_s`` without a keystroke of any window: between keystrokes a person
   types (~120 ms apart) it would only be paused again, and each pause costs the next
   keystroke a stop and a swap of KV states. A running foreground request is never
   interrupted by another window's: its prompt is the expensive part, already paid for.
4. Latest wins per document: a request replaces the waiting and running requests of
   the same window and document (a foreground one replaces background work too).
5. A window that disconnects loses everything it asked for: its waiting requests are
   dropped and its running one is stopped.

The scheduler is pure bookkeeping: it returns a ``Plan`` (what to start, stop, pause)
and the engine carries it out, so every rule above is tested without a model.

    >>> s = Scheduler(quiet_s=0.25)
    >>> s.submit(Job(1, window=1, background=True), now=0.0).start.id
    1
    >>> plan = s.submit(Job(2, window=2, background=False), now=1.0)
    >>> plan.pause.id, plan.start
    (1, None)
    >>> s.finished(1, paused=True, now=1.01).start.id   # the keystroke runs
    2
    >>> s.finished(2, now=1.5)                            # the read-ahead waits for quiet
    Plan(start=None, stop=(), pause=None, wake_at=1.75)
    >>> s.poke(now=1.75).start.id                         # then resumes
    1
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Job:
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
    waiting ones end as cancelled), ``pause`` the running background job, ``start`` one,
    and call ``poke`` at ``wake_at``."""

    start: Job | None = None
    stop: tuple[Job, ...] = ()
    pause: Job | None = None
    wake_at: float | None = None  # nothing started: ``poke`` again then (background waits)


# Background work waits this long after the last keystroke of any window (the windows'
# own background preparation waits as long, ``completion.engine._PREPARE_QUIET_S``).
QUIET_S = 0.25


@dataclass(slots=True)
class Scheduler:
    """The rules above; every method takes ``now`` (seconds, monotonic)."""

    quiet_s: float = QUIET_S
    running: Job | None = None
    waiting: list[Job] = field(default_factory=list)
    last_foreground: float = float("-inf")  # when a keystroke last arrived or ended
    _stopping: bool = False  # the running job was told to stop or pause
    _seq: itertools.count[int] = field(default_factory=itertools.count)

    def submit(self, job: Job, *, now: float) -> Plan:
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
        running = self.running
        if running is not None and not self._stopping:
            if self._replaces(job, running):
                running.abandoned = True
                stop.append(running)
                self._stopping = True
            elif running.background and not job.background:
                pause = running
                self._stopping = True
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
        """The running job ended; ``paused``: it was paused before producing a token and
        goes back in the queue (unless it was abandoned meanwhile)."""
        running = self.running
        if running is None or running.id != job_id:
            raise ValueError(f"job {job_id} is not the running one")
        self.running = None
        self._stopping = False
        if not running.background:
            self.last_foreground = now
        if paused and not running.abandoned:
            self.waiting.append(running)
        return self._next(now)

    def _drop(self, matches: Callable[[Job], bool], now: float) -> Plan:
        stop = [job for job in self.waiting if matches(job)]
        self.waiting = [job for job in self.waiting if not matches(job)]
        running = self.running
        if running is not None and matches(running) and not running.abandoned:
            stop.append(running)
            self._stopping = True
        for job in stop:
            job.abandoned = True
        return self._next(now, stop=tuple(stop))

    @staticmethod
    def _replaces(new: Job, old: Job) -> bool:
        if not new.document or (new.window, new.document) != (old.window, old.document):
            return False
        return not new.background or old.background

    def _next(self, now: float, stop: tuple[Job, ...] = (), pause: Job | None = None) -> Plan:
        """The plan, starting the best waiting job if nothing runs (background work only
        once it has been quiet for ``quiet_s``)."""
        if self.running is not None or not self.waiting:
            return Plan(stop=stop, pause=pause)
        best = max(self.waiting, key=lambda job: (not job.background, job.seq))
        quiet_from = self.last_foreground + self.quiet_s
        if best.background and now < quiet_from:
            return Plan(stop=stop, pause=pause, wake_at=quiet_from)
        self.waiting.remove(best)
        self.running = best
        return Plan(start=best, stop=stop, pause=pause)
