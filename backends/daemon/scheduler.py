"""Which generation the shared engine runs next, for every window at once.

One model and one KV cache serve all windows, so generations run one at a time; what
matters is the order. The rule, in full:

1. A keystroke's request (foreground) runs before any background work (reading a file
   ahead, preparing the cursor's window, a prefetch), whichever window sent either.
2. Among waiting keystrokes, the window served least recently goes first, and of one
   window's the newest (the user is at the newest keystroke; older ones are most likely
   stale). Among background work, the newest first.
3. A foreground request arriving while background work runs pauses it: the engine stops
   it (within one decode step; what it evaluated stays in the KV memory) and puts it back
   in the queue, to resume where it stopped. Background work (re)starts only after
   ``quiet_s`` without a keystroke of any window: between keystrokes a person types
   (~120 ms apart) it would only be paused again, and each pause costs the next keystroke
   a stop and a swap of KV states.
4. Windows take turns: a keystroke's generation that has run for ``slice_s`` while
   another window's keystroke waits is paused the same way, and resumes after that one
   has had its turn. Without turns, a window whose answers are short waited for the
   other window's whole long answer at every keystroke (3.7x its latency alone, measured
   with the 0.5B; the other 2.4x); with them, two windows typing at once each wait about
   as long as their own answers take, so neither takes much more than 2x its time alone.
   One window's own keystrokes never take turns: a newer one replaces the older (rule 5).
5. Latest wins per document: a request replaces the waiting and running requests of
   the same window and document (a foreground one replaces background work too).
6. A window that disconnects loses everything it asked for: its waiting requests are
   dropped and its running one is stopped.

The scheduler is pure bookkeeping: it returns a ``Plan`` (what to start, stop, pause)
and the engine carries it out, so every rule above is tested without a model.

    >>> s = Scheduler(quiet_s=0.25, slice_s=1.0)
    >>> s.submit(Job(1, window=1, background=True), now=0.0).start.id
    1
    >>> plan = s.submit(Job(2, window=2, background=False), now=1.0)
    >>> plan.pause.id, plan.start
    (1, None)
    >>> s.finished(1, paused=True, now=1.01).start.id   # the keystroke runs
    2
    >>> s.submit(Job(3, window=3, background=False), now=1.2)  # its turn comes at 2.01
    Plan(start=None, stop=(), pause=None, wake_at=2.01)
    >>> s.poke(now=2.01).pause.id                         # window 2 has had its slice
    2
    >>> s.finished(2, paused=True, now=2.05).start.id    # window 3's turn
    3
    >>> s.finished(3, now=2.5).start.id                   # window 2 resumes
    2
    >>> s.finished(2, now=3.0)                            # the read-ahead waits for quiet
    Plan(start=None, stop=(), pause=None, wake_at=3.25)
    >>> s.poke(now=3.25).start.id                         # then resumes
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
# A keystroke's turn while another window's waits. Each turn costs a stop (one decode
# step), a swap of KV states and one token evaluated again: ~0.1 s for the 1.5B on two
# cores, so a turn of a second keeps that under a tenth; a keystroke of the 1.5B with a
# 32-token answer takes 1.5-3 s on that machine, so it still gets turns.
SLICE_S = 1.0


@dataclass(slots=True)
class Scheduler:
    """The rules above; every method takes ``now`` (seconds, monotonic)."""

    quiet_s: float = QUIET_S
    slice_s: float = SLICE_S
    running: Job | None = None
    running_since: float = 0.0  # when the running job (re)started
    waiting: list[Job] = field(default_factory=list)
    last_foreground: float = float("-inf")  # when a keystroke last arrived or ended
    _stopping: bool = False  # the running job was told to stop or pause
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    _starts: itertools.count[int] = field(default_factory=itertools.count)
    served: dict[int, int] = field(default_factory=dict)  # window -> order of its last start

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
        self.served.pop(window, None)
        return self._drop(lambda job: job.window == window, now)

    def poke(self, *, now: float) -> Plan:
        """Time passed (a ``wake_at``): start background work if it is quiet now."""
        return self._next(now)

    def finished(self, job_id: int, *, now: float, paused: bool = False) -> Plan:
        """The running job ended; ``paused``: it stopped because it was told to pause, and
        goes back in the queue to resume (unless it was abandoned meanwhile)."""
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

    def _best(self) -> Job:
        """Keystrokes first; of those, the least recently served window's, then the
        newest; of background work, the newest."""

        def rank(job: Job) -> tuple[bool, int, int]:
            turn = 0 if job.background else -self.served.get(job.window, -1)
            return (not job.background, turn, job.seq)

        return max(self.waiting, key=rank)

    def _next(self, now: float, stop: tuple[Job, ...] = (), pause: Job | None = None) -> Plan:
        """The plan, starting the best waiting job if nothing runs (background work only
        once it has been quiet for ``quiet_s``), or pausing a keystroke whose turn is up."""
        running = self.running
        if running is not None:
            if running.background or self._stopping or pause is not None:
                return Plan(stop=stop, pause=pause)
            turn_ends = self._turn_ends()
            if turn_ends is None or now < turn_ends:
                return Plan(stop=stop, wake_at=turn_ends)
            self._stopping = True
            return Plan(stop=stop, pause=running)
        if not self.waiting:
            return Plan(stop=stop, pause=pause)
        best = self._best()
        quiet_from = self.last_foreground + self.quiet_s
        if best.background and now < quiet_from:
            return Plan(stop=stop, pause=pause, wake_at=quiet_from)
        self.waiting.remove(best)
        self.running, self.running_since = best, now
        self.served[best.window] = next(self._starts)
        return Plan(start=best, stop=stop, pause=pause, wake_at=self._turn_ends())

    def _turn_ends(self) -> float | None:
        """When the running keystroke's turn ends, if another window's keystroke waits."""
        running = self.running
        if running is None or running.background:
            return None
        if any(not j.background and j.window != running.window for j in self.waiting):
            return self.running_since + self.slice_s
        return None
