"""tests/unit is pure: no test here starts a process or opens a socket (those are in
tests/process and tests/). The guard below makes a test that does fail, saying what it
started."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest


class Impure(AssertionError):
    """A unit test started a process or opened a socket."""


def _refuse(what: str) -> Any:
    def refused(*args: Any, **kwargs: Any) -> None:
        raise Impure(
            f"tests/unit starts no process and opens no socket ({what}); "
            "such a test belongs in tests/process"
        )

    return refused


_socket_init = socket.socket.__init__


def _socket(
    self: socket.socket, family: int = -1, type: int = -1, proto: int = -1, fileno: Any = None
) -> None:
    # A socket wrapping a descriptor made elsewhere is let through: asyncio's event loop
    # wakes itself with a ``socketpair`` that never leaves the process.
    if fileno is None:
        raise Impure("tests/unit opens no socket; such a test belongs in tests/process")
    _socket_init(self, family, type, proto, fileno)


@pytest.fixture(autouse=True)
def pure() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", _refuse("subprocess.Popen"))
        patch.setattr(os, "fork", _refuse("os.fork"))
        patch.setattr(os, "posix_spawn", _refuse("os.posix_spawn"))
        patch.setattr(socket.socket, "__init__", _socket)
        yield
