"""Whatever a workspace holds, the index builds, updates and retrieves in bounded time
(issue #34): workspaces drawn at random from special files (FIFOs, sockets, devices,
each also named ``.gitignore``), links (loops, to ``/``, to a FIFO, to a file), huge,
binary and non-UTF-8 files, and folders that may not be entered. Every file of code in
a place the index may read is indexed; every special file is counted, never opened.
No model; each example is bounded (a hang fails it instead of blocking CI)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kode.completion.project.index_worker import read_text
from kode.completion.project.retrieval import Retriever
from kode.completion.project.workspace import IndexLimits, WorkspaceIndex

BOUND_S = 20.0  # one step (a build, all updates, a retrieval) of one example
MAX_BYTES = 4096
SPECIAL = ("fifo", "socket", "device")
KINDS = (
    *("code", "binary", "huge", "latin", "empty"),
    *SPECIAL,
    *("link_loop", "link_root", "link_fifo", "link_file", "locked_folder"),
    *("gitignore_fifo", "gitignore_socket", "gitignore_folder", "gitignore_link"),
)
FOLDERS = ("", "pkg", "pkg/sub", "other")
NAMES = ("m0.py", "m1.py", "m2.js", "notes.txt")


def bounded(call: Callable[[], Any], seconds: float = BOUND_S) -> Any:
    result: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result.append(call())
        except BaseException as exc:  # re-raised in the test's thread
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if failure:
        raise failure[0]
    return result[0]


class Hostile:
    """A workspace being made: what was put where, and what must be closed after."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.code: set[Path] = set()  # files the index must hold
        self.special = 0  # special files the build must count
        self.locked: list[Path] = []
        self.sockets: list[socket.socket] = []

    def make(self, kind: str, folder: str, name: str) -> None:
        where = self.root / folder
        if any(where == p or p in where.parents for p in self.locked):
            return  # inside a folder made unreadable: cannot be made (when not root)
        where.mkdir(parents=True, exist_ok=True)
        gitignore = kind.startswith("gitignore_")
        if gitignore:
            name, kind = ".gitignore", kind.removeprefix("gitignore_")
        path = where / name
        if os.path.lexists(path):
            return  # the first kind drawn for a path stays
        self.special += gitignore  # read as a file is: not a regular one, so skipped
        code = path.suffix in (".py", ".js")
        if kind == "code":
            stem = path.stem
            path.write_text(f"def {stem}_{len(self.code)}_quill():\n    return 1\n")
            if code:
                self.code.add(path)
        elif kind in ("binary", "huge", "latin", "empty"):
            data = {
                "binary": b"\x00\x01\x02 binary",
                "huge": b"x = 1\n" * (MAX_BYTES // 6 + 1),
                "latin": b"name = '\xe9'\n",
                "empty": b"",
            }[kind]
            path.write_bytes(data)
            if kind == "empty" and code:
                self.code.add(path)  # an empty file of code is indexed (no words)
        elif kind in SPECIAL or kind == "folder":
            self._special(kind, path)
            self.special += code  # the walk meets it among the files of code
        elif kind == "link_loop":
            path.symlink_to(path)
        elif kind == "link_root":
            path.symlink_to("/")
        elif kind == "link_fifo":
            target = where / f"fifo-{len(self.sockets)}-{name}.target"
            if not os.path.lexists(target):
                os.mkfifo(target)
            path.symlink_to(target)
        elif kind in ("link_file", "link"):
            target = where / f"{name}.target"
            if not os.path.lexists(target):
                target.write_text("def linked_thing(): pass\n")
            path.symlink_to(target)
        elif kind == "locked_folder":
            path.mkdir()
            (path / "inside.py").write_text("def locked_quill(): pass\n")
            path.chmod(0)
            self.locked.append(path)
            if os.geteuid() == 0:  # root reads it anyway
                self.code.add(path / "inside.py")

    def _special(self, kind: str, path: Path) -> None:
        if kind == "folder":
            path.mkdir()
        elif kind == "socket":
            server = socket.socket(socket.AF_UNIX)
            server.bind(str(path))
            self.sockets.append(server)
        elif kind == "device":
            try:
                os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's
            except PermissionError:
                os.mkfifo(path)  # not allowed here: a FIFO stands in
        else:
            os.mkfifo(path)

    def close(self) -> None:
        for server in self.sockets:
            server.close()
        for path in self.locked:
            with contextlib.suppress(OSError):
                path.chmod(0o700)


@contextlib.contextmanager
def hostile_workspace(entries: list[tuple[str, str, str]]) -> Iterator[Hostile]:
    # Short, under /tmp: a Unix socket's path must fit in 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="kode-h-", dir="/tmp")).resolve()
    made = Hostile(root)
    try:
        for entry in entries:
            made.make(*entry)
        yield made
    finally:
        made.close()
        shutil.rmtree(root, ignore_errors=True)


def everything_under(root: Path) -> list[Path]:
    """Every entry under ``root``, links and special files included (not followed)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        found += [Path(dirpath) / name for name in (*dirnames, *filenames)]
    return found


entry = st.tuples(st.sampled_from(KINDS), st.sampled_from(FOLDERS), st.sampled_from(NAMES))


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(st.lists(entry, min_size=1, max_size=24))
def test_any_workspace_indexes_in_bounded_time(entries: list[tuple[str, str, str]]) -> None:
    with hostile_workspace(entries) as made:
        index = WorkspaceIndex([made.root], IndexLimits(max_file_bytes=MAX_BYTES))
        try:
            stats = bounded(index.build)
            assert stats.complete and not stats.truncated
            held = {p for p in made.code if index.entry(p) is not None}
            assert held == made.code
            assert stats.skipped_special == made.special
            # Every path handed to an update (a watcher reports what it sees): bounded,
            # and what the build indexed stays indexed.
            for path in everything_under(made.root):
                bounded(lambda p=path: index.update(p))
            assert {p for p in made.code if index.entry(p) is not None} == made.code
            retriever = Retriever(index, lambda p: read_text(p, MAX_BYTES))
            text = "import pkg\n\nvalue = m0_0_quill("
            bounded(lambda: list(retriever.retrieve(None, text, len(text), 2000)))
        finally:
            index.close()
