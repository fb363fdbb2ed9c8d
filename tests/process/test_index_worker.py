"""Reading and parsing workspace files never waits on what the workspace holds (issue
#34): what is not a regular file is never opened, and a parse that does not answer in
time is given up and its child replaced. No model; each wait is bounded."""

from __future__ import annotations

import os
import socket
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kode.completion.project import index_worker
from kode.completion.project.index_worker import (
    BINARY,
    LARGE,
    MISSING,
    OK,
    SPECIAL,
    parse_file,
    read_file,
    read_text,
)
from kode.completion.project.workspace import IndexLimits, WorkspaceIndex

BOUND_S = 10.0  # far more than any of these takes; a hang fails instead of blocking CI


def bounded(call: Callable[[], Any], seconds: float = BOUND_S) -> Any:
    """``call()`` in a daemon thread; fails the test if it does not return in time."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    return result[0]


@pytest.fixture
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "sock.py"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    try:
        yield path
    finally:
        server.close()


def test_only_a_regular_file_is_read(tmp_path: Path, unix_socket: Path) -> None:
    regular = tmp_path / "mod.py"
    regular.write_text("def f(): pass\n")
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)  # no writer: a blocking open would wait for good
    link = tmp_path / "link.py"
    link.symlink_to(regular)
    loop = tmp_path / "loop.py"
    loop.symlink_to(tmp_path / "loop2.py")
    (tmp_path / "loop2.py").symlink_to(loop)
    folder = tmp_path / "folder.py"
    folder.mkdir()
    assert read_file(regular, 100)[:2] == (OK, b"def f(): pass\n")
    for path in (fifo, unix_socket, link, loop, folder):
        assert bounded(lambda p=path: read_file(p, 100))[:2] == (SPECIAL, b""), path
    assert read_file(tmp_path / "gone.py", 100)[0] == MISSING
    assert read_file(tmp_path / "mod.py" / "under_a_file.py", 100)[0] == MISSING
    assert bounded(lambda: read_text(fifo, 100)) is None


def test_a_device_is_never_opened(tmp_path: Path) -> None:
    device = tmp_path / "null.py"
    try:
        os.mknod(device, stat.S_IFCHR | 0o600, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("no permission to make a device node here")
    assert read_file(device, 100)[0] == SPECIAL


def test_a_fifo_swapped_in_after_the_look_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between ``lstat`` and ``open`` a file can be replaced: the open does not block
    (``O_NONBLOCK``) and ``fstat`` sees the FIFO."""
    regular = tmp_path / "was_regular.py"
    regular.write_text("x = 1\n")
    fifo = tmp_path / "now_fifo.py"
    os.mkfifo(fifo)
    real_lstat = os.lstat

    def stale_lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        return real_lstat(regular if Path(path) == fifo else path, *args, **kwargs)

    monkeypatch.setattr(index_worker.os, "lstat", stale_lstat)
    assert bounded(lambda: read_file(fifo, 100))[0] == SPECIAL


def test_sizes_and_contents_are_bounded(tmp_path: Path) -> None:
    huge = tmp_path / "huge.py"
    huge.write_bytes(b"x" * 5000)
    binary = tmp_path / "blob.py"
    binary.write_bytes(b"\x00\x01binary")
    latin = tmp_path / "latin.py"
    latin.write_bytes(b"name = '\xe9'\n")
    assert read_file(huge, 4999)[0] == LARGE and read_file(huge, 5000)[0] == OK
    assert parse_file(str(huge), None, 1000)[0] == LARGE
    assert parse_file(str(binary), None, 1000)[0] == BINARY
    assert parse_file(str(latin), None, 1000)[0] == BINARY  # not UTF-8
    # An open document's text is parsed whatever is at its path now.
    fifo = tmp_path / "doc.py"
    os.mkfifo(fifo)
    status, _, _, items, _ = bounded(lambda: parse_file(str(fifo), "def g(): pass\n", 1000))
    assert status == OK and [name for name, _, _ in items] == ["g"]


def index_of(root: Path, **limits: Any) -> WorkspaceIndex:
    index = WorkspaceIndex([root], IndexLimits(**limits))
    bounded(index.build)
    return index


def test_a_fifo_created_in_the_workspace_is_skipped_and_indexing_goes_on(
    tmp_path: Path,
) -> None:
    (tmp_path / "first.py").write_text("def first_quill(): pass\n")
    index = index_of(tmp_path)
    try:
        fifo = tmp_path / "mod.py"
        os.mkfifo(fifo)
        assert bounded(lambda: index.update(fifo)) is False
        assert index.stats.skipped_special == 1
        later = tmp_path / "later.py"
        later.write_text("def later_brisk(): pass\n")
        assert bounded(lambda: index.update(later)) is True
        assert index.find_definitions("later_brisk")
    finally:
        index.close()


def test_a_fifo_named_gitignore_is_passed_by(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("def a_quill(): pass\n")
    index = index_of(tmp_path)
    try:
        gitignore = tmp_path / ".gitignore"
        os.mkfifo(gitignore)
        assert bounded(lambda: index.update(gitignore)) is False  # rules re-read next
        later = tmp_path / "b.py"
        later.write_text("def b_brisk(): pass\n")
        assert bounded(lambda: index.update(later)) is True
        assert index.find_definitions("b_brisk")
    finally:
        index.close()
    rebuilt = index_of(tmp_path)  # the walk meets it too
    try:
        assert rebuilt.stats.complete and rebuilt.stats.files == 2
        assert rebuilt.stats.skipped_special == 1
    finally:
        rebuilt.close()


def test_the_walk_counts_special_files_and_follows_no_link(
    tmp_path: Path, unix_socket: Path
) -> None:
    (tmp_path / "real.py").write_text("def real_quill(): pass\n")
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "root").symlink_to("/")
    (tmp_path / "self.py").symlink_to(tmp_path / "self.py")
    index = index_of(tmp_path)
    try:
        stats = index.stats
        assert stats.complete and stats.files == 1
        assert stats.skipped_special == 2  # the FIFO and the socket
        # A link loop handed to an update is refused, not raised.
        assert bounded(lambda: index.update(tmp_path / "self.py")) is False
    finally:
        index.close()


def hanging_child(marker: str) -> Callable[[int, int], list[str]]:
    """The real child, but its ``open`` of a path holding ``marker`` never returns (a
    read of a hung network filesystem)."""
    command = index_worker._worker_command

    def build(parent: int, nice: int) -> list[str]:
        argv = command(parent, nice)
        argv[3] = (
            "import os, time; real = os.open; "
            f"os.open = lambda p, *a, **k: time.sleep(3600) if {marker!r} in str(p) "
            "else real(p, *a, **k); " + argv[3]
        )
        return argv

    return build


def test_a_parse_that_hangs_is_given_up_and_the_child_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(index_worker, "_worker_command", hanging_child("stuck"))
    (tmp_path / "a.py").write_text("def a_quill(): pass\n")
    index = index_of(tmp_path, parse_timeout_s=0.5)
    try:
        first = index.worker_pid
        stuck = tmp_path / "stuck.py"
        stuck.write_text("def stuck_thing(): pass\n")
        assert bounded(lambda: index.update(stuck)) is False  # two tries of 0.5 s
        assert index.stats.timed_out == 1
        assert index.worker_pid != first
        later = tmp_path / "later.py"
        later.write_text("def later_brisk(): pass\n")
        assert bounded(lambda: index.update(later)) is True
    finally:
        index.close()


def test_a_child_that_takes_no_request_is_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An open document's text larger than the pipe holds, to a child that reads
    nothing: the write is bounded too."""
    deaf = (
        "import sys, time; sys.stdout.buffer.write(b'kode-index-worker\\n'); "
        "sys.stdout.flush(); time.sleep(3600)"
    )
    monkeypatch.setattr(
        index_worker, "_worker_command", lambda _p, _n: [sys.executable, "-c", deaf]
    )
    (tmp_path / "doc.py").write_text("")
    index = WorkspaceIndex([tmp_path], IndexLimits(parse_timeout_s=0.5))
    try:
        text = "value = 1\n" * 30_000  # 300 KB: more than a pipe's 64 KB
        assert bounded(lambda: index.update(tmp_path / "doc.py", text)) is False
        assert index.stats.timed_out == 1
    finally:
        index.close()
