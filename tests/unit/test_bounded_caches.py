"""Every cache of the names monitor (completion/project/members.py, receivers.py) has a bound,
and the bound holds; a module not found is looked up again; nothing compiled is imported
into this process to read its names. Clocks are counters moved by hand."""

from __future__ import annotations

import importlib.machinery
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fakes.timing import SettableClock
from kode.completion.project import members
from kode.completion.project.members import Lru, Resolver
from kode.completion.project.receivers import _CACHE, Receivers


def unread(name: str) -> frozenset[str] | None:
    raise AssertionError(f"no compiled module is read here ({name})")


# -- the LRU --------------------------------------------------------------------------


def test_an_lru_never_holds_more_than_its_limit() -> None:
    lru: Lru[int, str] = Lru(100)
    for i in range(1000):
        lru.put(i, str(i), cost=1 + i % 17)
        assert lru.cost <= 100
    assert lru.get(999) == "999"  # the newest are kept
    lru.put(-1, "huge", cost=101)  # alone over the limit: not kept, nothing else dropped
    assert lru.get(-1) is None and lru.get(999) == "999"


def test_an_lru_drops_the_least_recently_used() -> None:
    lru: Lru[str, int] = Lru(2)
    lru.put("a", 1)
    lru.put("b", 2)
    assert lru.get("a") == 1
    lru.put("c", 3)
    assert lru.get("b") is None and lru.keys() == ["a", "c"]


# -- the resolver's caches ------------------------------------------------------------


def test_the_parse_cache_is_bounded_by_bytes_of_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(members, "PARSE_CACHE_BYTES", 4 * (1000 + members.PARSE_OVERHEAD))
    for i in range(20):
        (tmp_path / f"mod{i}.py").write_text(f"X{i} = 1\n" + "#" * 990 + "\n")
    resolver = Resolver(paths=[str(tmp_path)], compiled=unread)
    for i in range(20):
        info = resolver.module(f"mod{i}")
        assert info is not None and f"X{i}" in info.names
        entries, cost = resolver.held()["parses"]
        assert cost <= members.PARSE_CACHE_BYTES and entries <= 4
    assert resolver.held()["parses"][0] == 4


def test_an_edited_file_replaces_its_parse(tmp_path: Path) -> None:
    source = tmp_path / "edited.py"
    resolver = Resolver(paths=[str(tmp_path)], compiled=unread)
    for i in range(5):
        source.write_text(f"V{i} = 1\n")
        stat = source.stat()
        os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + i * 2_000_000_000))
        info = resolver.module("edited")
        assert info is not None and info.names == {f"V{i}"}
    assert resolver.held()["parses"][0] == 1  # not one per modification time


def test_a_file_under_two_names_reads_its_relative_imports_under_each(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text("from .sibling import thing\n")
    resolver = Resolver(paths=[str(tmp_path), str(tmp_path / "pkg")], compiled=unread)
    inside = resolver.module("pkg.mod")
    alone = resolver.module("mod")
    assert inside is not None and inside.imported == {"thing": ("pkg.sibling", "thing")}
    assert alone is not None and alone.imported == {"thing": ("sibling", "thing")}


def test_a_source_too_large_is_not_parsed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(members, "MAX_SOURCE_BYTES", 100)
    (tmp_path / "small.py").write_text("A = 1\n")
    (tmp_path / "large.py").write_text("B = 1\n" + "#" * 200 + "\n")
    resolver = Resolver(paths=[str(tmp_path)], compiled=unread)
    assert resolver.module("small") is not None
    assert resolver.module("large") is None and resolver.module_members("large") is None


def test_member_sets_and_locations_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(members, "MEMBER_SETS", 5)
    monkeypatch.setattr(members, "LOCATIONS", 7)
    for i in range(30):
        (tmp_path / f"m{i}.py").write_text(f"N{i} = 1\n")
    resolver = Resolver(paths=[str(tmp_path)], compiled=unread)
    for i in range(30):
        found = resolver.module_members(f"m{i}")
        assert found is not None and f"N{i}" in found
        assert resolver.module_members(f"absent{i}") is None
        held = resolver.held()
        assert held["members"][0] <= 5 and held["locations"][0] <= 7


def test_a_module_installed_after_a_miss_is_found(tmp_path: Path) -> None:
    clock = SettableClock()
    resolver = Resolver(paths=[str(tmp_path)], clock=clock, compiled=unread)
    assert resolver.module_members("installed_late") is None
    (tmp_path / "installed_late").mkdir()
    (tmp_path / "installed_late" / "__init__.py").write_text("def run():\n    pass\n")
    clock.now = members.MISS_SECONDS / 2
    assert resolver.module_members("installed_late") is None  # not looked up again yet
    clock.now = members.MISS_SECONDS
    found = resolver.module_members("installed_late")
    assert found is not None and "run" in found


def test_a_module_whose_file_is_gone_is_looked_up_again(tmp_path: Path) -> None:
    resolver = Resolver(paths=[str(tmp_path)], compiled=unread)
    (tmp_path / "moved.py").write_text("OLD = 1\n")
    found = resolver.module_members("moved")
    assert found is not None and "OLD" in found
    (tmp_path / "moved.py").unlink()  # an upgrade made it a package
    (tmp_path / "moved").mkdir()
    (tmp_path / "moved" / "__init__.py").write_text("NEW = 1\n")
    assert resolver.module("moved") is None  # the file it knew is gone
    found = resolver.module_members("moved")
    assert found is not None and "NEW" in found and "OLD" not in found


def test_an_analysis_that_missed_a_module_is_redone_once_it_is_there(tmp_path: Path) -> None:
    clock = SettableClock()
    resolver = Resolver(paths=[str(tmp_path), *sys.path], clock=clock, compiled=unread)
    receivers = Receivers(resolver)
    text = "import arrives_later\n\nx = arrives_later.\n"
    line = "x = arrives_later."
    assert receivers.names(text, len(text) - 1, line) is None
    (tmp_path / "arrives_later.py").write_text("def greet():\n    pass\n")
    clock.now = members.MISS_SECONDS
    found = receivers.names(text, len(text) - 1, line)  # the same place, the same text
    assert found is not None and "greet" in found.members["arrives_later"]


def test_the_receivers_keep_a_bounded_number_of_analyses(tmp_path: Path) -> None:
    receivers = Receivers(Resolver(paths=[str(tmp_path)], compiled=unread))
    for i in range(3 * _CACHE):
        text = f"X{i} = 1\n\ny = \n"
        receivers.names(text, len(text) - 1, "y = ")
        assert receivers.held <= _CACHE
    assert receivers.held == _CACHE


# -- compiled modules -----------------------------------------------------------------


def _compiled_not_loaded() -> str:
    for name in sorted(sys.stdlib_module_names):
        if name in sys.modules or name in sys.builtin_module_names:
            continue
        try:
            spec = importlib.machinery.PathFinder.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            return name
    pytest.skip("every compiled standard-library module is loaded here")


def test_a_compiled_module_is_read_elsewhere_never_imported_here() -> None:
    name = _compiled_not_loaded()
    asked: list[str] = []

    def child(module: str) -> frozenset[str]:
        asked.append(module)
        return frozenset({"spam", "eggs"})

    resolver = Resolver(compiled=child)
    assert resolver.module_members(name) == frozenset({"spam", "eggs"})
    assert resolver.is_module(name)
    assert resolver.module_members(name) == frozenset({"spam", "eggs"})
    assert asked == [name]  # read once, then kept
    assert name not in sys.modules


def test_a_compiled_module_loaded_here_is_read_without_a_child() -> None:
    loaded = next(
        n for n in sys.builtin_module_names if n in sys.modules and n in sys.stdlib_module_names
    )
    assert Resolver(compiled=unread).module_members(loaded) == frozenset(dir(sys.modules[loaded]))


def test_a_compiled_module_that_did_not_import_is_asked_again_later() -> None:
    name = _compiled_not_loaded()
    clock = SettableClock()
    answers: list[frozenset[str] | None] = [None, frozenset({"late"})]
    resolver = Resolver(clock=clock, compiled=lambda _name: answers.pop(0))
    assert resolver.module_members(name) is None
    assert not resolver.is_module(name)  # a module that does not import is not there
    clock.now = members.MISS_SECONDS
    assert resolver.module_members(name) == frozenset({"late"})


def test_the_child_s_names_are_its_last_line(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[list[str]] = []

    def run(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
        calls.append(args)
        out = b'\x1b[?1034h\n["a", "b"]\n' if args[-1] == "noisy" else b"not json\n"
        return subprocess.CompletedProcess(args, 0, out, b"")

    monkeypatch.setattr(members.subprocess, "run", run)
    assert members.names_in_child("noisy") == frozenset({"a", "b"})  # after terminal output
    assert members.names_in_child("broken") is None
    assert calls[0][:4] == [sys.executable, "-I", "-S", "-c"]


def test_tree_sitter_parsers_are_kept_for_a_bounded_number_of_language_ids() -> None:
    from kode.completion import syntax

    syntax._tree_sitter.cache_clear()
    for n in range(syntax.PARSERS_KEPT + 10):
        syntax._tree_sitter(f"no-such-language-{n}")
    assert syntax._tree_sitter.cache_info().currsize == syntax.PARSERS_KEPT
    syntax._tree_sitter.cache_clear()
