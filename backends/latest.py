"""Latest wins, the rule every layer applies to a document's requests: per key, only the
newest claim is current; an older one finds out by asking (``holds``) and stops.

The editor's completion engine keys it by document (``completion/engine.py``), the team
server by API key and document (``serve/service.py``); the shared engine's scheduler
applies the same rule to its queues (``backends/daemon/scheduler.py``, rule 4).

    >>> latest: Latest[str, str] = Latest()
    >>> latest.claim("a.py", "first"), latest.claim("a.py", "second")
    (None, 'first')
    >>> latest.holds("a.py", "first"), latest.holds("a.py", "second")
    (False, True)
    >>> latest.release("a.py", "first")       # a stale claim releases nothing
    >>> latest.current("a.py"), "a.py" in latest
    ('second', True)
    >>> latest.release("a.py"); latest.current("a.py") is None
    True
"""

from __future__ import annotations

from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Latest(Generic[K, V]):
    """The current claim per key."""

    def __init__(self) -> None:
        self._claims: dict[K, V] = {}

    def claim(self, key: K, value: V) -> V | None:
        """Make ``value`` the current claim on ``key``; return the one it replaced."""
        older = self._claims.get(key)
        self._claims[key] = value
        return older

    def current(self, key: K) -> V | None:
        return self._claims.get(key)

    def holds(self, key: K, value: V) -> bool:
        """Whether ``value`` is still the current claim on ``key``."""
        return self._claims.get(key) is value

    def release(self, key: K, value: V | None = None) -> None:
        """Forget ``key``'s claim (only if it is ``value``, when given)."""
        if value is None or self._claims.get(key) is value:
            self._claims.pop(key, None)

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` has a current claim."""
        return key in self._claims

    def __len__(self) -> int:
        return len(self._claims)
