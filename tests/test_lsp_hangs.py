"""Nothing in the workspace or the runtime folder hangs a window (issue #34).

Each of the issue's four situations against the real ``kode lsp`` over stdio, the 0.5B,
a fresh workspace and engine folder each (``conftest.py``): the window keeps indexing
new files, answers, answers ``shutdown`` and is gone after ``exit`` without waiting for
what still runs in it, says at most one clear thing, and leaves no process. Every wait
is for a state, bounded only so that a hang fails (a busy machine is slow, not wrong):
no time is measured."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from engine_windows import engine_pids, eventually
from lsp_process import StdioWindow, gone_within

STEP_S = 120.0  # a model load on a busy 2-core machine
SHUTDOWN_S = 10.0  # the server's bound (5 s) and the pipe's
GONE_S = 30.0  # a hang guard on a process ending, never a measure (``StdioWindow.end``'s)
IN_PROCESS = {
    "model": "small",
    "engine": "inProcess",
    "readAhead": False,
    "prefetch": False,
    "firstAnswerMs": 0,
    "maxTokens": 8,
}
TEXT = "def area(width, height):\n    return "


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    root.mkdir()
    (root / "shapes.py").write_text(TEXT)
    (root / "util.py").write_text("def helper_quill(x):\n    return x\n")
    return root


def items(reply: dict[str, Any]) -> list[str]:
    assert "result" in reply, reply
    return [item["insertText"] for item in reply["result"]["items"]]


def indexed_files(window: StdioWindow) -> int:
    workspace = window.stats()["workspace"]
    return int(workspace["files"]) if workspace is not None and workspace["complete"] else -1


def ended(window: StdioWindow) -> None:
    """``shutdown`` (answered), then ``exit``: the process ends by itself (``end`` waits
    for it, up to ``GONE_S``), with LSP's code for an exit after ``shutdown``."""
    window.end(SHUTDOWN_S)
    assert window.proc.returncode is not None, "the window outlived exit"
    assert window.proc.returncode == 0


async def ends_cleanly(window: StdioWindow) -> None:
    children = window.children()
    ended(window)
    assert gone_within(children, GONE_S), f"left running: {children}"


async def keeps_indexing(window: StdioWindow, root: Path, before: int) -> None:
    later = root / "later.py"
    later.write_text("def later_brisk():\n    return 1\n")
    window.created(later)
    assert await eventually(lambda: indexed_files(window) == before + 1, 30)


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.parametrize("name", ["mod.py", ".gitignore"])
async def test_a_fifo_in_the_workspace_hangs_nothing(
    workspace: Path, tmp_path: Path, name: str
) -> None:
    """Situations 1 and 2: a FIFO ``mod.py`` blocked the index's child in ``open`` for
    good (nothing indexed afterwards); one named ``.gitignore`` blocked an update in a
    server thread, so ``shutdown`` got no answer and the process outlived ``exit``."""
    with StdioWindow(tmp_path / "window.log") as window:
        window.initialize(workspace, IN_PROCESS, STEP_S)
        assert await eventually(lambda: indexed_files(window) == 2, 60)
        fifo = workspace / name
        os.mkfifo(fifo)
        window.created(fifo)
        await keeps_indexing(window, workspace, 2)
        if name == "mod.py":
            assert window.stats()["workspace"]["skipped"]["special"] == 1
        window.open((workspace / "shapes.py").as_uri(), TEXT)
        assert items(window.complete((workspace / "shapes.py").as_uri(), 1, 11, STEP_S))
        await ends_cleanly(window)
        assert window.shown == []


@pytest.mark.model
@pytest.mark.slow
async def test_a_folder_at_the_engine_socket_path_is_said_once(
    workspace: Path, tmp_path: Path, engine_folder: Path
) -> None:
    """Situation 3: a folder where the shared engine's socket goes made the window
    spawn 73 engines, each dying on it, and answer after the 180 s start timeout."""
    from kode.backends import models
    from kode.backends.daemon.paths import EngineConfig, place_for
    from kode.completion.settings import parse

    options = {**IN_PROCESS, "engine": "shared"}
    settings, problems = parse(options)
    assert not problems
    config = EngineConfig(
        model=models.resolve("small"),
        n_ctx=settings.context_size,
        threads=settings.threads,
        kv_memory_mb=settings.kv_memory_mb,
    )
    place = place_for(config)  # in this test's engine folder, as the window's
    place.socket.mkdir()
    with StdioWindow(tmp_path / "window.log") as window:
        window.initialize(workspace, options, STEP_S)
        window.open((workspace / "shapes.py").as_uri(), TEXT)
        assert items(window.complete((workspace / "shapes.py").as_uri(), 1, 11, STEP_S))
        assert engine_pids(engine_folder) == []
        assert len(window.shown) == 1, window.shown
        assert f"{place.socket} is a folder" in window.shown[0]
        assert f"rmdir {place.socket}" in window.shown[0]
        assert window.stats()["engineProcess"]["kind"] == "inProcess"
        await ends_cleanly(window)
    assert place.socket.is_dir() and engine_pids(engine_folder) == []


@pytest.mark.model
@pytest.mark.slow
async def test_the_windows_own_settings_change_is_not_an_engine_failure(
    workspace: Path, tmp_path: Path
) -> None:
    """Situation 4: a settings change while a generation ran in the shared engine closed
    the window's connection under it, shown as "Kode: this window closed its connection
    to the Kode engine" (-32803 and a popup). And the swap freed the old backend's
    tokenizer while the window's preparation still counted tokens with it: the window
    died of SIGSEGV, its requests never answered (6 of about 80 runs of a variant)."""
    long = {"maxTokens": 300, "multiline": "always", "maxLines": 300}
    shared = {**IN_PROCESS, **long, "engine": "shared", "partialCompletions": True}
    primes = 'def primes():\n    """The first 300 primes."""\n    return [\n'
    primes += "        2,\n        3,\n"
    numbers = (workspace / "numbers.py").as_uri()
    shapes = (workspace / "shapes.py").as_uri()
    with StdioWindow(tmp_path / "window.log") as window:
        window.initialize(workspace, shared, STEP_S)
        window.open(shapes, TEXT)
        window.open(numbers, primes)
        assert items(window.complete(shapes, 1, 11, STEP_S))  # the engine is up
        generating = window.complete_async(numbers, 5, 0)
        # a line of this request is done: its generation runs in the engine (the first
        # request's partials, still queued, do not count)
        if window.partial(generating, STEP_S) is None:
            pytest.fail("no partial completion: the generation never ran")
        window.notify("workspace/didChangeConfiguration", {"settings": {**IN_PROCESS, **long}})
        # a place never asked before (the first one's answer is remembered and would be
        # shown without the backend): the pool swaps the backend for it
        fresh = (workspace / "fresh.py").as_uri()
        window.open(fresh, TEXT)
        answer = window.complete_async(fresh, 1, 11)
        assert "result" in window.answer(generating, STEP_S)  # obsolete: no error
        assert items(window.answer(answer, STEP_S))
        assert window.stats()["engineProcess"]["kind"] == "inProcess"
        await ends_cleanly(window)
        assert window.shown == []


@pytest.mark.model
def test_a_closed_tokenizer_refuses_instead_of_reading_freed_memory() -> None:
    """The cause of situation 4's crash, alone: after ``close`` (the pool swapping the
    backend), a tokenize or an uncached piece raises ``BackendClosed``, which a request
    answers as obsolete and preparation drops, instead of calling llama.cpp on the freed
    model (SIGSEGV: the whole window gone)."""
    from kode.backends import models
    from kode.backends.errors import BackendClosed
    from kode.backends.llama.runtime import LlamaModel

    vocab = LlamaModel(models.resolve("small"), vocab_only=True)
    assert vocab.tokenize("def f(x):")[0] == 750 and vocab.piece(750) == b"def"
    vocab.close()
    vocab.close()  # twice is fine
    with pytest.raises(BackendClosed):
        vocab.tokenize("def f(x):\n    return x\n" * 50)
    with pytest.raises(BackendClosed):
        vocab.piece(751)
    assert vocab.piece(750) == b"def"  # remembered: no call into the model


def test_exit_never_waits_for_a_thread(tmp_path: Path) -> None:
    """Whatever still runs in the window (here a thread that never ends, as one stuck in
    a read of a hung filesystem would be; the interpreter joins such threads at exit,
    and ``asyncio.run`` its executor's), ``exit`` ends the process, with the exit code
    LSP asks for, and the log names what was left: it ended without joining the thread
    (a join would wait an hour; ``GONE_S`` turns that into a failure)."""
    script = (
        "import threading, time\n"
        "from kode.lsp.server import build_server\n"
        "threading.Thread(target=time.sleep, args=(3600,), name='stuck-read').start()\n"
        "build_server().start_io()\n"
    )
    log = tmp_path / "window.log"
    with StdioWindow(log, [sys.executable, "-c", script]) as window:
        window.initialize(None, {"enabled": False}, 60)
        ended(window)
    assert "still running: stuck-read" in log.read_text()
