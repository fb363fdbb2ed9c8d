"""The engine's workspace wiring with a scripted backend: the index is built off the event
loop, retrieved definitions reach the prompt, and saves, edits and deletes keep the index
current. No model."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from fakes.completion import NO_READ_AHEAD, CachingBackend, ScriptedBackend, engine_for
from fakes.projects import constants_project
from fakes.timing import until
from kode.backends.errors import Superseded
from kode.completion.clock import ManualClock
from kode.completion.documents import Position
from kode.completion.engine import CompletionEngine
from kode.completion.project.context import REINDEX_DELAY_S
from kode.completion.project.workspace import IndexStats, WorkspaceIndex
from test_workspace import wait_gone

# The engine tests' settings but for the project's snippets, which these tests are about.
PROJECT = {"readAhead": False}


async def built(engine: CompletionEngine, root: Path) -> None:
    engine.open_workspace([root])
    index = engine.workspace
    assert index is not None
    async with asyncio.timeout(10):
        while not index.stats.complete:
            await asyncio.sleep(0.01)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "geometry.py").write_text(
        "def circle_area_quill(radius):\n    return 3.14 * radius * radius\n"
    )
    (tmp_path / "pkg" / "app.py").write_text("from pkg import geometry\n\narea = geometry.")
    return tmp_path


async def complete_app(engine: CompletionEngine, project: Path) -> str:
    uri = (project / "pkg" / "app.py").as_uri()
    text = (project / "pkg" / "app.py").read_text()
    if uri not in engine.documents:
        engine.documents.open(uri, text, 1, "python")
    doc = engine.documents.get(uri)
    await engine.complete(uri, doc.position_at(len(doc.text)))
    await engine.cancel(uri)
    backend = await engine.backend()
    assert isinstance(backend, ScriptedBackend)
    return backend.requests[-1].prompt


async def build_watched(
    engine: CompletionEngine, root: Path
) -> tuple[WorkspaceIndex, list[tuple[int, bool]]]:
    """Index ``root`` through the engine while the event loop looks at the index every
    5 ms; returns the index and what the loop saw before the build was complete: the
    files indexed, and whether the parsing child was running. A build that held the loop
    would be seen only before it began and once it was complete, never in between. No
    time is measured; the 60 s only turn a hang into a failure."""
    engine.open_workspace([root])
    index = engine.workspace
    assert index is not None
    seen: list[tuple[int, bool]] = []
    async with asyncio.timeout(60):
        while True:
            state = len(index), index.worker_pid is not None
            if index.stats.complete:
                return index, seen
            seen.append(state)
            await asyncio.sleep(0.005)


async def test_the_closed_defining_module_reaches_the_prompt(project: Path) -> None:
    backend = ScriptedBackend(["circle_area_quill(r)"])
    engine = engine_for(backend, defaults=PROJECT)
    await built(engine, project)
    prompt = await complete_app(engine, project)
    assert "<|file_sep|>pkg/geometry.py\ndef circle_area_quill(radius):" in prompt
    assert prompt.index("circle_area_quill") < prompt.index("<|fim_prefix|>")
    off = engine_for(backend, defaults=PROJECT, retrievalTokens=0)
    await built(off, project)
    assert "circle_area_quill" not in await complete_app(off, project)
    await engine.aclose()
    await off.aclose()


async def test_save_and_delete_update_what_is_retrieved(project: Path) -> None:
    backend = ScriptedBackend(["x"])
    engine = engine_for(backend, defaults=PROJECT)
    await built(engine, project)
    index = engine.workspace
    assert index is not None
    geometry = project / "pkg" / "geometry.py"
    geometry.write_text("def square_area_brisk(side):\n    return side * side\n")
    engine.files_changed([(geometry.as_uri(), False)])  # didSave / watched change
    await until(lambda: index.find_definitions("square_area_brisk"))  # its own thread
    prompt = await complete_app(engine, project)
    assert "square_area_brisk" in prompt and "circle_area_quill" not in prompt
    geometry.unlink()
    engine.files_changed([(geometry.as_uri(), True)])  # watched delete
    await until(lambda: not index.find_definitions("square_area_brisk"))
    assert "square_area_brisk" not in await complete_app(engine, project)
    await engine.aclose()


async def test_edits_reindex_once_the_user_pauses(project: Path) -> None:
    clock = ManualClock()
    engine = engine_for(ScriptedBackend(["x"]), defaults=PROJECT, clock=clock)
    await built(engine, project)
    uri = (project / "pkg" / "geometry.py").as_uri()
    engine.documents.open(uri, "def old(): pass\n", 1, "python")
    index = engine.workspace
    assert index is not None
    for version in range(2, 6):  # typing: no re-index per keystroke
        engine.documents.change(uri, version, [(f"def typed_name_{version}(): pass\n", None)])
        engine.document_changed(uri)
        await clock.advance(REINDEX_DELAY_S / 2)
    assert index.find_definitions("typed_name_5") == []
    # The pause: the version is the same at two checks one delay apart; re-indexed once.
    await clock.advance(REINDEX_DELAY_S)
    await clock.advance(REINDEX_DELAY_S)
    async with asyncio.timeout(5):
        while not index.find_definitions("typed_name_5"):
            await asyncio.sleep(0.01)
    assert index.find_definitions("typed_name_2") == []
    await engine.aclose()


async def test_building_a_large_index_does_not_block_the_event_loop(tmp_path: Path) -> None:
    for i in range(400):
        (tmp_path / f"m{i}.py").write_text(
            "".join(f"def f_{i}_{j}(a):\n    return a\n" for j in range(30))
        )
    engine = engine_for(ScriptedBackend(["x"]), defaults=PROJECT)
    index, seen = await build_watched(engine, tmp_path)
    assert len(index) == 400
    # A blocked loop would see nothing of the build until it was over; with the build in
    # a thread the loop runs every GIL switch interval, and sees the index grow.
    assert any(0 < size < 400 for size, _ in seen), seen
    await engine.aclose()


async def test_a_large_file_does_not_stall_the_event_loop(tmp_path: Path) -> None:
    """``ast.parse`` of a large file holds the interpreter lock for the whole call (in the
    server that was one stall as long as the parse); the child parses it, so the loop
    goes on ticking meanwhile."""
    big = "".join(
        f"def handler_{i}(request, *args, **kwargs):\n    '''Doc {i}.'''\n"
        f"    return dispatch_{i % 97}(request, args, kwargs, [x for x in range({i})])\n\n"
        for i in range(5000)
    )
    for name in ("a", "b", "c"):
        (tmp_path / f"{name}.py").write_text(big)
    engine = engine_for(ScriptedBackend(["x"]), defaults=PROJECT)
    index, seen = await build_watched(engine, tmp_path)
    # No ``ast.parse`` of them here, where it would hold the loop: all three in the
    # child, and the loop went on while the child had them.
    assert len(index) == 3 and index.stats.parsed_in_child == 3
    assert index.stats.parsed_here == 0
    assert any(child and size < 3 for size, child in seen), seen
    assert len(index.find_definitions("handler_4999", limit=5)) == 3
    pid = index.worker_pid
    await engine.aclose()
    assert pid is None or wait_gone(pid)


async def test_closing_the_engine_stops_the_build_and_its_child(tmp_path: Path) -> None:
    for i in range(300):
        (tmp_path / f"m{i}.py").write_text(f"def f_{i}(a):\n    return a\n" * 50)
    engine = engine_for(ScriptedBackend(["x"]), defaults=PROJECT)
    engine.open_workspace([tmp_path])
    index = engine.workspace
    assert index is not None
    async with asyncio.timeout(30):
        while index.worker_pid is None:
            await asyncio.sleep(0.005)
    pid = index.worker_pid
    assert pid is not None
    async with asyncio.timeout(10):  # before, closing waited for the whole build
        await engine.aclose()
    assert not index.stats.complete and len(index) < 300
    assert wait_gone(pid)


async def test_a_keystroke_keeps_the_prepared_project_context(project: Path) -> None:
    """A name typed on the line resolves and changes the retrieved snippets; evaluating
    the prompt again from there would not fit ``firstAnswerMs`` on a slow machine, so the
    keystroke answers with the snippets the window was prepared with (not a short window
    without any project context), and background preparation catches up."""
    from kode.completion.documents import Position

    backend = CachingBackend(["x"])
    engine = engine_for(backend, rate=100.0, defaults=NO_READ_AHEAD, firstAnswerMs=1000)
    await built(engine, project)
    app = project / "pkg" / "app.py"
    body = "from pkg import geometry\n\n" + "".join(
        f"value_{i} = compute ( {i} )\n" for i in range(300)
    )
    uri = app.as_uri()
    engine.documents.open(uri, body + "area = ", 1, "python")
    engine.cursor_moved(uri, Position(302, 7))
    await until(lambda: engine.preparation.prepared >= 2, 10)
    prepared = backend.requests[-1].prompt
    assert "def circle_area_quill(radius):" in prepared  # the outline
    assert "return 3.14" not in prepared  # no definition: the name is not written yet
    typed = "geometry.circle_area_quill(r"
    engine.documents.change(uri, 2, [(body + "area = " + typed, None)])
    await engine.complete(uri, Position(302, 7 + len(typed)))
    prompt = backend.requests[-1].prompt
    assert engine.kept_snippets == 1 and engine.short_answers == 0
    assert prompt.split("<|fim_prefix|>")[0] == prepared.split("<|fim_prefix|>")[0]
    # Preparing again brings the typed name's definition in for the next keystrokes.
    engine.cursor_moved(uri, Position(302, 7 + len(typed)))
    await until(lambda: "return 3.14" in backend.requests[-1].prompt, 10)
    await engine.aclose()


async def test_without_a_workspace_the_prompt_is_what_it_was(project: Path) -> None:
    """HumanEval's infilling has no workspace (the engine never opens one): retrieval
    returns nothing and the prompt is exactly the one with project context off; so is it
    with a workspace holding only the edited file (it is never retrieved)."""
    backend = ScriptedBackend(["x"])
    alone = project / "alone"
    alone.mkdir()
    task = alone / "task.py"
    task.write_text("def add(a, b):\n    \n\n\ndef check():\n    assert add(1, 2) == 3\n")

    async def prompt(engine: CompletionEngine) -> str:
        uri = task.as_uri()
        engine.documents.open(uri, task.read_text(), 1, "python")
        doc = engine.documents.get(uri)
        await engine.complete(uri, doc.position_at(task.read_text().index("    \n") + 4))
        await engine.cancel(uri)
        engine.documents.close(uri)
        return backend.requests[-1].prompt

    off = engine_for(backend, defaults=PROJECT, retrievalTokens=0)
    none = engine_for(backend, defaults=PROJECT)
    assert none.workspace is None
    one_file = engine_for(backend, defaults=PROJECT)
    await built(one_file, alone)
    assert len(one_file.workspace or ()) == 1
    expected = await prompt(off)
    assert "<|fim_prefix|>def add(a, b):" in expected
    assert await prompt(none) == expected
    assert await prompt(one_file) == expected
    for engine in (off, none, one_file):
        await engine.aclose()


class DenseBackend(ScriptedBackend):
    """Counts every run of letters, every digit and every other character as a token:
    numeric constants cost far more tokens than their characters / 4."""

    def count_tokens(self, text: str) -> int:
        import re

        return len(re.findall(r"[A-Za-z]+|\d|[^\sA-Za-z\d]", text)) + 1


async def test_an_outline_of_constants_leaves_room_for_the_definitions(tmp_path: Path) -> None:
    """``starlette/endpoints.py:87``: the outline of ``status.py`` was chosen by characters
    and, fitted to tokens in prompt order, took all of ``retrievalTokens``; the
    definitions of the names used at the cursor, after it, were dropped. Chosen by the
    backend's tokens, both reach the prompt, within the budget."""
    app = constants_project(tmp_path)
    backend = DenseBackend(["x"])
    engine = engine_for(backend, defaults=PROJECT, retrievalTokens=256, snippetTokens=0)
    await built(engine, tmp_path)
    uri = app.as_uri()
    engine.documents.open(uri, app.read_text(), 1, "python")
    doc = engine.documents.get(uri)
    await engine.complete(uri, doc.position_at(len(doc.text)))
    await engine.cancel(uri)
    prompt = backend.requests[-1].prompt
    context = prompt.split("<|file_sep|>web/endpoints.py")[0]
    assert "web/status.py\nWS_10" in context  # the outline
    assert '"""Run the awaitables given, return when the first one is done."""' in context
    assert "return await to_thread(func, *args)" in context
    snippets = context.split("<|file_sep|>")[1:]  # after the repository name
    assert sum(backend.count_tokens(s.split("\n", 1)[1]) + 8 for s in snippets) <= 256
    await engine.aclose()


async def test_the_index_build_waits_while_the_model_generates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even an idle-priority parsing child slowed the 1.5B's decoding 1.5-2x on two
    cores (its threads meet at a barrier many times a step): the build goes on only
    while this window's model is idle.

    Told in order, not in seconds: the build asks to go on (``pause``, before each batch)
    while a generation runs, which goes on until the test stops it; nothing is indexed
    then, and every time the build went on, the generation had ended."""
    for i in range(50):
        (tmp_path / f"m{i}.py").write_text(f"def f_{i}(a):\n    return a\n")
    backend = ScriptedBackend(["x"] * 100_000, delay=0.01)  # until the test cancels it
    engine = engine_for(backend, defaults=PROJECT, multiline="always")
    asked = threading.Event()
    went_on_while_generating: list[bool] = []
    build = WorkspaceIndex.build

    def watched_build(
        index: WorkspaceIndex,
        cancel: threading.Event | None = None,
        pause: Callable[[], float] | None = None,
    ) -> IndexStats:
        assert pause is not None

        def watched_pause() -> float:  # in the build's thread
            asked.set()
            waited = pause()
            went_on_while_generating.append(backend.generations[0].stats.finish_reason is None)
            return waited

        return build(index, cancel, watched_pause)

    monkeypatch.setattr(WorkspaceIndex, "build", watched_build)
    uri = (tmp_path / "m0.py").as_uri()
    engine.documents.open(uri, "a = ", 1)
    request = asyncio.ensure_future(engine.complete(uri, Position(0, 4)))
    await until(lambda: backend.generations)
    engine.open_workspace([tmp_path])
    try:  # aclose ends the index's parsing child, also when an assertion fails
        index = engine.workspace
        assert index is not None
        await until(asked.is_set, 30)
        assert len(index) == 0 and not index.stats.complete  # the model is generating
        assert not backend.generations[0].stats.finish_reason
        await engine.cancel(uri)  # the generation ends: the model is idle
        with pytest.raises(Superseded):
            await request
        await until(lambda: index.stats.complete, 30)
        assert len(index) == 50
        assert went_on_while_generating, "the build never asked"
        assert not any(went_on_while_generating), went_on_while_generating
    finally:
        await engine.aclose()


async def test_a_stuck_index_update_holds_up_neither_retrieval_nor_closing(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """#34: an update stuck in a read (a FIFO opened for reading waited for a writer
    for good) ran on the event loop's default executor; a few of them took every
    thread of it, so retrieval waited too, and ``aclose`` (the LSP ``shutdown``) waited
    for them. Updates now run in order on a daemon thread of the index's own."""
    engine = engine_for(ScriptedBackend(["x"]), defaults=PROJECT)
    await built(engine, project)
    index = engine.workspace
    assert index is not None
    release = threading.Event()
    stuck: list[Path] = []
    unstuck: list[Path] = []

    def blocked_update(path: Path, text: str | None = None) -> bool:
        stuck.append(path)
        release.wait(30)
        unstuck.append(path)
        return False

    monkeypatch.setattr(index, "update", blocked_update)
    try:
        engine.files_changed([((project / f"m{i}.py").as_uri(), False) for i in range(40)])
        async with asyncio.timeout(5):
            while not stuck:
                await asyncio.sleep(0.01)
        # The default executor is free: retrieval's thread work runs at once.
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 2) == "free"
        assert "circle_area_quill" in await complete_app(engine, project)
        await asyncio.wait_for(engine.aclose(), 5)
        assert not unstuck  # closed while the update was still stuck: it did not wait
        assert len(stuck) == 1  # one at a time, and none started after the close
    finally:
        release.set()
