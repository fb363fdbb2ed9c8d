"""Which receivers' members are known at a cursor, read from source without running it."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest
from fakes.completion import URI, ScriptedBackend, engine_for
from kode.completion.documents import Position
from kode.completion.project.members import Resolver
from kode.completion.project.receivers import Receivers
from test_healing import HealingBackend

PACKAGE = {
    "shapes/__init__.py": "from .base import *\nVERSION = 1\n",
    "shapes/base.py": (
        "__all__ = ['Shape', 'area']\n"
        "class Shape:\n"
        "    sides = 0\n"
        "    def __init__(self, name):\n"
        "        self.name = name\n"
        "    def describe(self):\n"
        "        self.described = True\n"
        "def area(s):\n    return 0\n"
        "def _hidden():\n    pass\n"
    ),
    "shapes/circle.py": (
        "from shapes.base import Shape\n"
        "class Circle(Shape):\n"
        "    def __init__(self, r):\n        self.radius = r\n"
        "class Odd(Shape):\n"
        "    def __getattr__(self, name):\n        return 1\n"
        "class Magic(Unknown):\n    pass\n"
        "class Err(ValueError):\n    pass\n"
        "class Dyn:\n"
        "    def set(self, k, v):\n        setattr(self, k, v)\n"
        "class Mixin:\n"
        "    def host(self):\n        return self._netloc.lower()\n"
    ),
    "lazy.py": "def __getattr__(name):\n    return name\n",
    "writes.py": "g = globals()\nfor k in 'ab':\n    g[k] = 1\n",
    "reads.py": "def has(n):\n    return n in globals()\nX = 1\n",
}


@pytest.fixture
def resolver(tmp_path: Path) -> Resolver:
    for rel, text in PACKAGE.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return Resolver(paths=[str(tmp_path), *sys.path])


def test_module_members_follow_star_imports_and_list_submodules(resolver: Resolver) -> None:
    members = resolver.module_members("shapes")
    assert members is not None
    assert {"VERSION", "Shape", "area", "base", "circle", "__name__"} <= members
    assert "_hidden" not in members and "sides" not in members
    assert resolver.module_members("shapes.nothing") is None  # not found: free


def test_modules_that_add_names_at_run_time_are_open(resolver: Resolver) -> None:
    assert resolver.module_members("lazy") is None  # module __getattr__
    assert resolver.module_members("writes") is None  # writes through globals()
    assert resolver.module_members("reads") == resolver.module_members("reads") is not None


def test_class_members_take_self_attributes_and_bases(resolver: Resolver) -> None:
    info = resolver.module("shapes.circle")
    assert info is not None
    circle = resolver.class_members(info, "Circle")
    assert circle is not None
    assert {"radius", "name", "described", "describe", "sides", "__init__"} <= circle
    err = resolver.class_members(info, "Err")
    assert err is not None and {"args", "with_traceback"} <= err  # a builtin base
    for open_class in ("Odd", "Magic", "Dyn"):  # __getattr__, unknown base, setattr(self)
        assert resolver.class_members(info, open_class) is None
    mixin = resolver.class_members(info, "Mixin")  # reads what its subclasses make
    assert mixin is not None and "_netloc" in mixin and "lower" not in mixin


@pytest.mark.parametrize("name", ["os", "os.path", "collections", "json", "math", "typing"])
def test_standard_library_members_cover_what_python_sees(name: str) -> None:
    """Every attribute the imported module has is allowed (the set may hold a few more:
    names of other platforms' branches)."""
    members = Resolver().module_members(name)
    assert members is not None
    assert set(dir(importlib.import_module(name))) <= members


def test_standard_library_modules_that_add_names_stay_open() -> None:
    resolver = Resolver()
    for name in ("re", "inspect", "signal"):  # global_enum, globals() alias, _convert_
        assert resolver.module_members(name) is None


DOC = """import os
import xml.etree.ElementTree
import json as j
from collections import OrderedDict
from shapes.circle import Circle
from pathlib import Path

path = Path('.')


class Box(Circle):
    def __init__(self):
        self.size = 1
        CURSOR_INIT

    def grow(self):
        x = os.path.join('a')
        CURSOR_GROW
"""


def names_at(resolver: Resolver, marker: str, line: str) -> dict[str, tuple[str, ...]] | None:
    text = DOC.replace(marker, line)
    offset = text.index(line) + len(line)
    found = Receivers(resolver).names(text, offset, line)
    return None if found is None else dict(found.members)


def test_receivers_of_a_document(resolver: Resolver) -> None:
    members = names_at(resolver, "CURSOR_GROW", "return self.")
    assert members is not None
    assert "join" in members["os.path"] and "getcwd" in members["os"]
    assert "loads" in members["j"] and "j" in members and "json" not in members
    assert "parse" in members["xml.etree.ElementTree"]
    assert "move_to_end" in members["OrderedDict"]
    assert {"size", "radius", "name", "grow"} <= set(members["self"])
    assert "Box" in members and "Circle" in members
    assert "Path" not in members or "path" not in members  # ``path`` is rebound
    assert "path" not in members


def test_a_module_changed_on_disk_is_read_again_at_the_same_place(
    resolver: Resolver, tmp_path: Path
) -> None:
    # The same text around the cursor (only the cursor's line edited): the analysis is
    # cached, but not past a change of a module it read (a rename the watcher reported).
    receivers = Receivers(resolver)
    text = "from shapes import base\n\n\ndef f():\n    area = base.\n"
    line = "    area = base."
    found = receivers.names(text, text.index(line) + len(line), line)
    assert found is not None and "area" in found.members["base"]
    base = tmp_path / "shapes" / "base.py"
    base.write_text(PACKAGE["shapes/base.py"].replace("area", "volume"))
    stat = base.stat()
    os.utime(base, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2_000_000_000))
    edited = text.replace("    area = ", "    surface = ")
    line = "    surface = base."
    found = receivers.names(edited, edited.index(line) + len(line), line)
    assert found is not None
    assert "volume" in found.members["base"] and "area" not in found.members["base"]


def test_a_name_bound_in_any_scope_is_left_free(resolver: Resolver) -> None:
    text = "import json\nimport os\n\ndef f(json):\n    for os in []:\n        pass\n    x = \n"
    found = Receivers(resolver).names(text, len(text) - 1, "    x = ")
    assert found is None or not {"json", "os"} & set(found.members)


def test_an_import_in_the_function_around_the_cursor_binds_there(resolver: Resolver) -> None:
    # A lazy import (typer imports rich_utils in the function that uses it): known below
    # it in that function, not in another function, not above it.
    template = (
        "import json\n\n\n"
        "def report(e):\n"
        "    A\n"
        "    if e:\n"
        "        from shapes import base as json\n"
        "        B\n"
        "    C\n\n\n"
        "def other():\n"
        "    D\n"
        "    from shapes import base\n"
    )
    receivers = Receivers(resolver)

    def members(at: str) -> dict[str, tuple[str, ...]]:
        text = template
        for mark in "ABCD":
            text = text.replace(f"    {mark}\n", "    x = \n" if mark == at else "    pass\n")
        line = ("        " if at == "B" else "    ") + "x = "
        found = receivers.names(text, text.index(line) + len(line), line)
        return {} if found is None else dict(found.members)

    assert "loads" in members("A")["json"]  # above the import: the module's json
    assert "area" in members("B")["json"] and "area" in members("C")["json"]
    other = members("D")
    assert "loads" in other["json"] and "base" not in other


def test_a_namespace_package_in_a_namespace_package_is_unknown_not_an_error(
    tmp_path: Path,
) -> None:
    # importlib's PathFinder raised KeyError for it (its parent not in sys.modules), and
    # every completion in a file importing such a module failed.
    (tmp_path / "nsx_outer" / "inner").mkdir(parents=True)
    (tmp_path / "nsx_outer" / "inner" / "mod.py").write_text("X = 1\n")
    resolver = Resolver(paths=[str(tmp_path)])
    assert resolver.module_members("nsx_outer.inner.mod") is None
    text = "from nsx_outer.inner import mod\n\nx = \n"
    assert Receivers(resolver).names(text, len(text) - 1, "x = ") is None


def test_self_begins_free_in_init_only(resolver: Resolver) -> None:
    text = DOC.replace("CURSOR_INIT", "self.").replace("CURSOR_GROW", "pass")
    offset = text.index("self.\n") + 5
    found = Receivers(resolver).names(text, offset, "        self.")
    assert found is not None and found.open_at_start == ("self",)
    text = DOC.replace("CURSOR_GROW", "self.").replace("CURSOR_INIT", "pass")
    found = Receivers(resolver).names(text, text.index("self.\n") + 5, "        self.")
    assert found is not None and found.open_at_start == ()


USES_DOC = """\
import os


class Encoder:
    def __init__(self, indent, sort_keys):
        self.indent = indent
        CURSOR
        self.cache = {}

    def encode(self, o):
        if self.sort_keys:
            o = sorted(o)
        return os.sep.join(self.indent for _ in o)

    class Inner:
        def f(self):
            return self.elsewhere


print(os.getcwd(), os.getcwd())
"""


def test_where_init_makes_an_attribute_the_names_the_class_uses_unmade_weigh(
    resolver: Resolver,
) -> None:
    text = USES_DOC.replace("CURSOR", "self.")
    line = "        self."
    found = Receivers(resolver).names(text, text.index(line + "\n") + len(line), line)
    assert found is not None and found.open_at_start == ("self",)
    # ``indent`` and ``cache`` are made on other lines; ``elsewhere`` is another class's
    assert set(found.unmade["self"]) == {"sort_keys"}
    text = USES_DOC.replace("CURSOR", "pass").replace("return os.", "return self.")
    line = "        return self."
    found = Receivers(resolver).names(text, text.index(line) + len(line), line)
    assert found is not None and found.unmade == {}  # not where attributes are made


def test_a_document_that_does_not_parse_still_gives_its_imports(resolver: Resolver) -> None:
    text = "import os\nx = (os.\n"
    found = Receivers(resolver).names(text, len(text) - 1, "x = (os.")
    assert found is not None and "getcwd" in found.members["os"]
    assert Receivers(resolver).names("x = (\ndef (", 3, "x = (") is None


async def test_engine_sends_the_receivers_with_the_setting_on() -> None:
    text = "import os\n\nx = os.\n"
    for on, language, backend_type in (
        (True, "python", HealingBackend),
        (False, "python", HealingBackend),
        (True, "plaintext", HealingBackend),
        (True, "python", ScriptedBackend),  # cannot apply it (a remote server)
    ):
        backend = backend_type(["getcwd()", "\n"])
        engine = engine_for(backend, namesMonitor=on)
        engine.documents.open(URI, text, 1, language)
        await engine.complete(URI, Position(2, 7))
        names = backend.requests[-1].names
        if on and language == "python" and backend_type is HealingBackend:
            assert names is not None and names.line == "x = os."
            assert "getcwd" in names.members["os"]
        else:
            assert names is None


async def test_a_failed_analysis_costs_the_monitor_not_the_completion(
    caplog: pytest.LogCaptureFixture,
) -> None:
    text = "import os\n\nx = os.\n"
    backend = HealingBackend(["getcwd()", "\n"])
    engine = engine_for(backend, namesMonitor=True)

    def broken(*args: object) -> None:
        raise KeyError("setuptools")

    engine.project.receivers.names = broken  # type: ignore[method-assign]
    engine.documents.open(URI, text, 1, "python")
    with caplog.at_level("WARNING", logger="kode.completion"):
        first = await engine.complete(URI, Position(2, 7))
        await engine.complete(URI, Position(2, 7))
    assert first.text == "getcwd()" and backend.requests[-1].names is None
    failed = [r for r in caplog.records if "names monitor: the analysis failed" in r.message]
    assert len(failed) == 1 and "KeyError" in failed[0].message


def test_a_module_made_in_the_workspace_after_a_lookup_is_found(tmp_path: Path) -> None:
    modules: dict[str, Path] = {}
    resolver = Resolver(modules.get, paths=[str(tmp_path)])
    assert resolver.module_members("brand_new") is None  # not there yet
    made = tmp_path / "brand_new.py"
    made.write_text("def spin():\n    pass\n")
    modules["brand_new"] = made  # the workspace index read it
    members = resolver.module_members("brand_new")
    assert members is not None and "spin" in members
