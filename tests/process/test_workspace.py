"""The workspace index on small fixture projects: what is indexed, .gitignore, updates,
module names, limits. No model."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kode.completion.project import index_worker
from kode.completion.project.index_worker import python_definitions
from kode.completion.project.workspace import IndexLimits, WorkspaceIndex
from kode.completion.project.workspace_files import Ignore, module_name


def write(root: Path, rel: str, text: str | bytes) -> Path:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write(tmp_path, "pkg/__init__.py", "VERSION = '1'\n")
    write(tmp_path, "pkg/util.py", "def helper_zeta(x):\n    return x + 1\n\nLIMIT = 3\n")
    write(tmp_path, "pkg/core.py", "from . import util\n\n\ndef run():\n    return util.LIMIT\n")
    write(tmp_path, "web/app.js", "export function renderPanelQuill(node) {\n  return node;\n}\n")
    write(tmp_path, ".gitignore", "generated/\n*.gen.py\n!keep.gen.py\n/top_only.py\n")
    write(tmp_path, "generated/out.py", "def generated_thing(): pass\n")
    write(tmp_path, "pkg/schema.gen.py", "def schema_thing(): pass\n")
    write(tmp_path, "pkg/keep.gen.py", "def kept_thing(): pass\n")
    write(tmp_path, "top_only.py", "def top_thing(): pass\n")
    write(tmp_path, "pkg/top_only.py", "def nested_top_thing(): pass\n")
    write(tmp_path, "node_modules/lib/index.js", "function vendored() {}\n")
    write(tmp_path, "pkg/blob.py", b"\x00\x01binary")
    write(tmp_path, "pkg/huge.py", "x = 1\n" * 400)
    write(tmp_path, "README.md", "# not code\n")
    return tmp_path


def build(root: Path, **limits: int) -> WorkspaceIndex:
    index = WorkspaceIndex([root], IndexLimits(**{"max_file_bytes": 2000, **limits}))
    index.build()
    return index


def indexed(index: WorkspaceIndex, root: Path) -> set[str]:
    return {
        p.relative_to(root.resolve()).as_posix()
        for p in (root.resolve()).rglob("*")
        if index.entry(p) is not None
    }


def test_build_indexes_code_and_honours_gitignore_binaries_and_size(project: Path) -> None:
    index = build(project)
    assert indexed(index, project) == {
        "pkg/__init__.py",
        "pkg/util.py",
        "pkg/core.py",
        "pkg/keep.gen.py",  # re-included by "!keep.gen.py"
        "pkg/top_only.py",  # "/top_only.py" is anchored to the root
        "web/app.js",
    }
    stats = index.stats
    assert stats.complete and not stats.truncated
    assert stats.skipped_binary == 1 and stats.skipped_large == 1
    assert stats.skipped_ignored >= 4  # generated/, schema.gen.py, top_only.py, node_modules/
    assert stats.approx_bytes > 0


def test_definitions_python_through_ast_and_other_languages_by_pattern(project: Path) -> None:
    index = build(project)
    [(path, definition)] = index.find_definitions("helper_zeta")
    assert path.name == "util.py" and definition.line == 0
    assert definition.header == "def helper_zeta(x):"
    [(path, definition)] = index.find_definitions("renderPanelQuill")
    assert path.name == "app.js"
    assert index.find_definitions("generated_thing") == []


def test_module_names_resolve_to_files(project: Path) -> None:
    index = build(project)
    util = index.module_path("pkg.util")
    assert util is not None and util.name == "util.py"
    package = index.module_path("pkg")
    assert package is not None and package.name == "__init__.py"
    assert module_name(Path("src/x.py")) == "src.x"
    assert module_name(Path("pkg/not-a-module.py")) is None


def test_src_layout_module_names(tmp_path: Path) -> None:
    write(tmp_path, "src/lib/io.py", "def read_all(): pass\n")
    index = build(tmp_path)
    found = index.module_path("lib.io")
    assert found is not None and found.name == "io.py"


def test_save_change_and_delete_keep_the_index_current(project: Path) -> None:
    index = build(project)
    util = (project / "pkg/util.py").resolve()
    before = index.version(util)
    # Saved to disk (didSave / didChangeWatchedFiles): read back from the file.
    util.write_text("def helper_omega(x):\n    return x\n", encoding="utf-8")
    assert index.update(util)
    assert index.find_definitions("helper_zeta") == []
    assert [p.name for p, _ in index.find_definitions("helper_omega")] == ["util.py"]
    assert index.version(util) > before
    # Edited in the editor, not saved (didChange): the open document's text.
    assert index.update(util, "class Gadget:\n    pass\n")
    assert [p.name for p, _ in index.find_definitions("Gadget")] == ["util.py"]
    assert index.find_definitions("helper_omega") == []
    # A new file, then deleted.
    fresh = write(project, "pkg/fresh.py", "def fresh_thing(): pass\n").resolve()
    assert index.update(fresh)
    assert index.module_path("pkg.fresh") == fresh
    fresh.unlink()
    index.remove(fresh)
    assert index.entry(fresh) is None and index.find_definitions("fresh_thing") == []
    assert index.module_path("pkg.fresh") is None
    assert all(path != fresh for path, _ in index.rank_files(["fresh_thing"]))


def test_updates_outside_the_workspace_or_ignored_are_refused(
    project: Path, tmp_path: Path
) -> None:
    index = build(project)
    ignored = write(project, "generated/late.py", "def late(): pass\n")
    assert not index.update(ignored)
    assert index.find_definitions("late") == []
    outside = tmp_path.parent / "elsewhere.py"
    assert not index.update(outside)


def test_limits_stop_indexing_and_say_so(project: Path) -> None:
    index = build(project, max_files=2)
    assert len(index) == 2 and index.stats.truncated


def test_many_updates_compact_dead_postings(tmp_path: Path) -> None:
    path = write(tmp_path, "a.py", "def first(): pass\n").resolve()
    index = build(tmp_path)
    for i in range(200):
        index.update(path, f"def name_{i}(): pass\n")
    # Postings of the 199 replaced versions were dropped, not kept as dead weight.
    assert index.stats.postings < 20
    assert [p for p, _ in index.rank_files(["name_199"])] == [path]


def test_rank_files_prefers_rare_shared_words(tmp_path: Path) -> None:
    write(tmp_path, "a.py", "import os\ndef parse_invoice_total(invoice): pass\n")
    write(tmp_path, "b.py", "import os\ndef unrelated(): pass\n")
    write(tmp_path, "c.py", "import os\nx = 1\n")
    index = build(tmp_path)
    ranked = [p.name for p, _ in index.rank_files(["os", "invoice", "parse_invoice_total"])]
    assert ranked[0] == "a.py"


def test_gitignore_rules() -> None:
    ignore = Ignore()
    ignore.add("", "*.log\nbuild/\n!important.log\ndocs/**/draft.md\n")
    ignore.add("sub", "local.py\n")
    assert ignore.ignored("x/debug.log", False)
    assert not ignore.ignored("important.log", False)
    assert ignore.ignored("build", True) and not ignore.ignored("build", False)
    assert ignore.ignored("docs/a/b/draft.md", False) and ignore.ignored("docs/draft.md", False)
    assert ignore.ignored("sub/local.py", False) and not ignore.ignored("local.py", False)


def test_python_definitions_fall_back_when_the_file_does_not_parse() -> None:
    broken = "def ok(a):\n    return a\n\ndef half_typed(\n"
    assert set(python_definitions(broken)) >= {"ok", "half_typed"}
    good = "class A:\n    def m(self): ...\nX: int = 1\n"
    assert set(python_definitions(good)) == {"A", "A.m", "X"}


def test_a_file_that_grows_too_large_leaves_the_index(project: Path) -> None:
    index = build(project)
    util = (project / "pkg/util.py").resolve()
    assert index.entry(util) is not None
    assert not index.update(util, "x = 1\n" * 1000)  # over max_file_bytes (2000)
    assert index.entry(util) is None and index.find_definitions("helper_zeta") == []


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, reaped or not, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pid: int, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_files_are_parsed_in_a_child_process(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ast.parse`` holds the interpreter lock for the whole call (150 ms for a 420 KB
    file): in the server it delayed every keystroke arriving meanwhile. The child parses;
    this process only merges (here its own parsing would fail)."""

    def no_parse(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("parsed in the server's process")

    monkeypatch.setattr(index_worker, "python_definitions", no_parse)
    monkeypatch.setattr(index_worker, "fallback_definitions", no_parse)
    index = build(project)
    assert index.stats.parsed_in_child == 8 and index.stats.parsed_here == 0  # + binary, huge
    [(path, definition)] = index.find_definitions("helper_zeta")
    assert path.name == "util.py" and definition.header == "def helper_zeta(x):"
    assert set(index.entry(path.resolve()).definitions) == {"helper_zeta", "LIMIT"}  # type: ignore[union-attr]
    # An open document's text goes through the child too.
    util = (project / "pkg" / "util.py").resolve()
    assert index.update(util, "class Gadget:\n    def spin(self):\n        pass\n")
    assert set(index.entry(util).definitions) == {"Gadget", "Gadget.spin"}  # type: ignore[union-attr]
    pid = index.worker_pid
    assert pid is not None and pid != os.getpid()
    index.close()
    assert wait_gone(pid)
    index.update(util, "def after_close(): pass\n")  # closed: updates are ignored
    assert index.find_definitions("after_close") == [] and index.worker_pid is None


def test_a_file_that_crashes_the_parser_is_skipped_and_the_build_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that raised its recursion limit segfaults in ``ast.parse`` on a long
    chain of operators: in the child, only the child dies; it is restarted, retried once,
    and the file is skipped."""
    command = index_worker._worker_command

    def fragile(parent: int, nice: int) -> list[str]:
        argv = command(parent, nice)
        argv[3] = "import sys; sys.setrecursionlimit(10**6); " + argv[3]
        return argv

    monkeypatch.setattr(index_worker, "_worker_command", fragile)
    write(tmp_path, "a_before.py", "def before_quill(): pass\n")
    write(tmp_path, "b_hostile.py", "x = " + "1+" * 300_000 + "1\n")
    write(tmp_path, "c_after.py", "def after_brisk(): pass\n")
    index = WorkspaceIndex([tmp_path])
    stats = index.build()
    assert stats.complete and stats.crashed == 1 and stats.files == 2
    assert index.find_definitions("before_quill") and index.find_definitions("after_brisk")
    assert index.entry((tmp_path / "b_hostile.py").resolve()) is None
    index.close()


def test_the_parsing_child_yields_the_cores_to_the_model(project: Path) -> None:
    """Niced, at the idle scheduling policy, and its scheduling autogroup niced where
    the kernel has them: the child has a session (so an autogroup) of its own, and a
    niced process alone in its group took a full share of the cores from the engine."""
    index = build(project)
    pid = index.worker_pid
    assert pid is not None
    try:
        nice = index.limits.worker_nice
        assert os.getpriority(os.PRIO_PROCESS, pid) >= min(
            19, os.getpriority(os.PRIO_PROCESS, 0) + nice
        )
        if hasattr(os, "sched_getscheduler"):
            assert os.sched_getscheduler(pid) == os.SCHED_IDLE
        group = Path(f"/proc/{pid}/autogroup")
        if Path("/proc/self/autogroup").exists():  # CONFIG_SCHED_AUTOGROUP kernels
            assert group.read_text().split()[-1] == str(nice), group.read_text()
            assert group.read_text() != Path("/proc/self/autogroup").read_text()
    finally:
        index.close()
    assert wait_gone(pid)


def test_the_parsing_child_exits_when_the_server_dies(tmp_path: Path) -> None:
    write(tmp_path, "m.py", "def f(): pass\n")
    script = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from kode.completion.project.workspace import WorkspaceIndex\n"
        "index = WorkspaceIndex([Path(sys.argv[1])])\n"
        "index.build()\n"
        "print(index.worker_pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    server = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        pid = int(server.stdout.readline())
        assert alive(pid)
        server.kill()  # SIGKILL: no clean-up runs in the server
        server.wait()
        assert wait_gone(pid)
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()


def test_what_the_index_keeps_is_not_walked_by_the_garbage_collector(tmp_path: Path) -> None:
    """A full collection walks every tracked object and stops every thread meanwhile:
    over the 1.1 M objects the index of the standard library held (a list per word, a
    ``Definition`` per definition) that took 0.4 s. Per file a few remain (its entry,
    path and ``Definitions``), whatever the number of words and definitions."""
    import gc

    for i in range(40):
        body = "".join(
            f"def f_{i}_{j}(word_{j}, shared):\n    return word_{j}\n" for j in range(50)
        )
        write(tmp_path, f"m{i}.py", body)
    gc.collect()
    before = len(gc.get_objects())
    index = WorkspaceIndex([tmp_path])
    index.build()
    gc.collect()
    held = len(gc.get_objects()) - before
    assert index.stats.postings > 40 * 50 and index.stats.definitions == 40 * 50
    assert held < 40 * 8, held
    # Compaction keeps the same form.
    for i in range(20):
        index.update((tmp_path / f"m{i}.py").resolve(), f"def g_{i}(): pass\n")
    index._compact()
    assert [p.name for p, _ in index.find_definitions("g_3")] == ["m3.py"]
    assert index.file_counts(["shared", "g_3"]) == {"shared": 20, "g_3": 1}
    ranked = index.rank_files({"g_3", "word_7"}, limit=3)
    assert ranked[0][0].name == "m3.py"
    index.close()


def test_a_build_stopped_while_it_waits_says_how_long_it_ran(project: Path) -> None:
    cancel = threading.Event()

    def pause() -> float:  # the model generates until the server closes the index
        time.sleep(0.05)
        cancel.set()
        return 0.05

    index = WorkspaceIndex([project], IndexLimits(max_file_bytes=2000))
    try:
        stats = index.build(cancel, pause)
        assert not stats.complete and len(index) == 0
        assert stats.paused_s == 0.05 and stats.build_s >= 0.05
    finally:
        index.close()
