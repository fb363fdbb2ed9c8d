"""Which names a module or a class has, read from source without running it.

The names monitor (``backends/monitor.py``) may hold a dereference to a receiver's
members only where the set is closed: every name that can follow the dot is known. A
module's members are its top-level bindings (definitions, assignments, imports, names a
function declares ``global``), its submodules if it is a package, and what its star
imports bring (resolved in turn); a class's are its body's bindings, the attributes its
methods assign or read on their first parameter (a mixin reads what its subclasses make,
``self._userinfo`` in ``urllib.parse``; a class being written reads what it will make),
``__slots__``, and its bases' members. Anything that may add names we cannot see makes
the set open (``None``): a module ``__getattr__``, ``globals()``, a star import or a base
that does not resolve, a class ``__getattr__``/``__getattribute__``, ``setattr`` or
``__dict__`` on its instances.

Modules are found the way Python's import system would, without importing: the
workspace index first, then ``importlib.machinery.PathFinder`` over the search path. A
compiled standard-library module (no source to read) is listed by ``dir()`` where this
process has it loaded already, else in a child interpreter of its own
(``names_in_child``): this process imports no extension module to read it (one's
initialisation may load a library or write to the terminal, and the language server's
stdout is its protocol).

Every cache is bounded (``Lru``): parses by bytes of source (``PARSE_CACHE_BYTES``),
member sets, locations and compiled modules' names by entries. A module not found is
looked up again after ``MISS_SECONDS`` (a package installed meanwhile is found), and a
located file that is gone is looked up again at once.
"""

from __future__ import annotations

import ast
import builtins
import importlib.machinery
import json
import os
import subprocess
import sys
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

# Attributes every module has.
MODULE_DUNDERS = frozenset(
    {"__name__", "__doc__", "__file__", "__spec__", "__loader__", "__package__", "__path__"}
    | {"__dict__", "__all__", "__builtins__", "__cached__", "__annotations__"}
)
# Attributes every class and instance has, and the dunders a class statement, dataclasses,
# enums and typing add.
CLASS_DUNDERS = frozenset(dir(object)) | frozenset(
    {"__dict__", "__module__", "__qualname__", "__name__", "__mro__", "__bases__", "__slots__"}
    | {"__weakref__", "__annotations__", "__dataclass_fields__", "__dataclass_params__"}
    | {"__match_args__", "__members__", "__orig_bases__", "__parameters__", "__wrapped__"}
    | {"__abstractmethods__", "__call__", "__enter__", "__exit__"}
)
# Class decorators that add no names but dunders: any other may make the class another
# thing altogether (``@_simple_enum(IntEnum)``), so it makes the class open.
PLAIN_DECORATORS = frozenset(
    {"dataclass", "total_ordering", "final", "runtime_checkable", "unique", "dataclass_transform"}
)
MAX_DEPTH = 6  # star imports, re-exports and bases followed at most this deep

# The caches' bounds. A parse (``ModuleInfo``) holds about as many bytes as its source
# (measured: 2.1 MB of standard-library source, 49 modules, held 2.3 MB once read), so
# the parse cache is bounded by bytes of source: 16 MB holds ~400 modules of the
# standard library's mean size (40 KB), several documents' imports (one importing 29
# standard modules read 49), and never more than ~20 MB of this process's memory.
PARSE_CACHE_BYTES = 16 << 20
PARSE_OVERHEAD = 1024  # bytes counted per parse beside its source (an empty __init__.py)
# A source larger than this is not parsed (unknown: the monitor stays free there):
# ``ast.parse`` holds the interpreter lock throughout, ~0.4 s a megabyte, and every
# keystroke waits meanwhile (completion/project/index_worker.py); 2 MB is ten times the
# standard library's largest module (_pydecimal.py, 230 KB).
MAX_SOURCE_BYTES = 2 << 20
# Modules' member sets kept (measured: ~12 KB each, so ~6 MB at most): a document
# importing 29 standard modules made 57 sets.
MEMBER_SETS = 512
LOCATIONS = 4096  # modules' locations kept (a name and a path: ~400 bytes each, ~1.6 MB)
# A module not found (or a compiled one not read) is looked up again after this long: a
# package installed after start is found, and a document importing what is not there
# looks it up at most once per this long, not at every keystroke.
MISS_SECONDS = 10.0
# Standard-library modules asked about as compiled ones, their names kept: more than the
# standard library's ~300 top-level modules (~70 of them compiled on Linux).
COMPILED_SETS = 512
CHILD_TIMEOUT_S = 10.0  # for the child that lists a compiled module's names

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Lru(Generic[K, V]):
    """A mapping that holds at most ``limit`` of cost (each entry's ``cost`` on ``put``, 1
    by default), dropping the least recently used first; an entry that alone costs more
    is not kept.

    >>> lru: Lru[str, int] = Lru(2)
    >>> lru.put("a", 1); lru.put("b", 2); _ = lru.get("a"); lru.put("c", 3)
    >>> sorted(lru.keys()), lru.cost
    (['a', 'c'], 2)
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.cost = 0
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def keys(self) -> list[K]:
        return list(self._items)

    def get(self, key: K) -> V | None:
        found = self._items.get(key)
        if found is None:
            return None
        self._items.move_to_end(key)
        return found[0]

    def put(self, key: K, value: V, cost: int = 1) -> None:
        self.pop(key)
        if cost > self.limit:
            return
        self._items[key] = (value, cost)
        self.cost += cost
        while self.cost > self.limit:
            _, (_, dropped) = self._items.popitem(last=False)
            self.cost -= dropped

    def pop(self, key: K) -> None:
        found = self._items.pop(key, None)
        if found is not None:
            self.cost -= found[1]


@dataclass(slots=True)
class ClassInfo:
    """What a class statement says of its members."""

    name: str
    members: set[str]
    bases: list[ast.expr]
    open: bool
    metaclass: bool = False  # the class object may have names its metaclass adds


@dataclass(slots=True)
class ModuleInfo:
    """What a module's source says: its bindings, where its imported names come from."""

    name: str  # dotted
    package: bool
    names: set[str] = field(default_factory=set)
    modules: dict[str, str] = field(default_factory=dict)  # local name -> module (import)
    imported: dict[str, tuple[str, str]] = field(default_factory=dict)  # from m import x
    classes: dict[str, ClassInfo] = field(default_factory=dict)
    stars: list[str] = field(default_factory=list)  # modules star-imported
    # star-imported in an ``if`` or ``try``: ignored where the module is not there at all
    # (``os`` imports ``nt`` on Windows); open where it is there but its names are not
    maybe_stars: list[str] = field(default_factory=list)
    all: set[str] | None = None  # a literal ``__all__``
    rebound: set[str] = field(default_factory=set)  # names bound otherwise than by import
    bound: dict[str, int] = field(default_factory=dict)  # how often each name is bound
    open: bool = False


def absolute(module: str, level: int, current: str, package: bool) -> str | None:
    """The dotted name of ``from <level dots><module> import ...`` inside ``current``.

    >>> absolute("sub", 1, "pkg.mod", False), absolute("", 2, "pkg.a.b", True)
    ('pkg.sub', 'pkg.a')
    """
    if level == 0:
        return module
    parts = current.split(".") if current else []
    if not package:
        parts = parts[:-1]
    if level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (level - 1)]
    return ".".join([*base, module] if module else base) or None


def _targets(node: ast.expr) -> Iterator[str]:
    if isinstance(node, ast.Name):
        yield node.id
    elif isinstance(node, ast.Tuple | ast.List):
        for elt in node.elts:
            yield from _targets(elt)
    elif isinstance(node, ast.Starred):
        yield from _targets(node.value)


# Calls that add names to a module at run time: enum's ``global_enum`` and ``_convert_``
# (``re``'s flags, ``signal``'s signals).
_ADDERS = frozenset({"global_enum", "_convert_"})


def _adds_names(node: ast.AST, aliases: set[str], defined: set[str]) -> bool:
    """Whether ``node`` may add module attributes we cannot see: writing ``globals()``
    or a name bound to it (``globals()[k] = v``, ``g.update(...)``), replacing the
    module in ``sys.modules``, or an enum helper that copies members into the module."""
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
        if _is_globals(node.value, aliases):
            return True
        return _dotted(node.value) == "sys.modules" and _dotted(node.slice) == "__name__"
    if isinstance(node, ast.Attribute) and node.attr in ("update", "setdefault"):
        return _is_globals(node.value, aliases)
    adders = _ADDERS - defined  # enum.py itself defines them
    if isinstance(node, ast.Call):
        return _last(node.func) in adders
    if isinstance(node, ast.ClassDef | ast.FunctionDef):
        return any(_last(d) in adders for d in node.decorator_list)
    return False


def _literal(node: ast.expr) -> bool:
    return isinstance(node, ast.List | ast.Tuple) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    )


def _is_globals(node: ast.expr, aliases: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in aliases
    return (
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "globals"
    )


def _last(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else None


def read_module(tree: ast.Module, name: str, package: bool) -> ModuleInfo:
    """A module's bindings from its syntax tree (``name``: its dotted name, for relative
    imports)."""
    info = ModuleInfo(name, package)

    def bind(target: str, by_import: bool = False) -> None:
        info.names.add(target)
        info.bound[target] = info.bound.get(target, 0) + 1
        if not by_import:
            info.rebound.add(target)

    def visit(body: Sequence[ast.stmt], branch: bool = False) -> None:
        """``branch``: inside an ``if`` or ``try`` (a platform's star import)."""
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                bind(node.name)
                if node.name == "__getattr__":
                    info.open = True
            elif isinstance(node, ast.ClassDef):
                bind(node.name)
                info.classes[node.name] = read_class(node)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    for n in _targets(target):
                        bind(n)
                        if n == "__all__":
                            info.all = _strings(node.value) if _literal(node.value) else None
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                for n in _targets(node.target):
                    bind(n)
                    if n == "__all__" and isinstance(node, ast.AugAssign):
                        known = info.all
                        grown = known is not None and _literal(node.value)
                        info.all = known | _strings(node.value) if known and grown else None
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        bind(alias.asname, True)
                        info.modules.setdefault(alias.asname, alias.name)  # the first branch's
                    else:
                        top = alias.name.split(".")[0]
                        bind(top, True)
                        info.modules.setdefault(top, top)
            elif isinstance(node, ast.ImportFrom):
                source = absolute(node.module or "", node.level, name, package)
                for alias in node.names:
                    if alias.name == "*":
                        if source is None:
                            info.open = True
                        else:
                            (info.maybe_stars if branch else info.stars).append(source)
                    else:
                        local = alias.asname or alias.name
                        bind(local, True)
                        if source is not None:
                            info.imported[local] = (source, alias.name)
            elif isinstance(node, ast.For | ast.AsyncFor):
                for n in _targets(node.target):
                    bind(n)
                visit(node.body, branch)
                visit(node.orelse, branch)
            elif isinstance(node, ast.With | ast.AsyncWith):
                for item in node.items:
                    if item.optional_vars is not None:
                        for n in _targets(item.optional_vars):
                            bind(n)
                visit(node.body, branch)
            elif isinstance(node, ast.If | ast.While):
                visit(node.body, True)
                visit(node.orelse, True)
            elif isinstance(node, ast.Try | ast.TryStar):
                visit(node.body, True)
                for handler in node.handlers:
                    if handler.name:
                        bind(handler.name)
                    visit(handler.body, True)
                visit(node.orelse, True)
                visit(node.finalbody, branch)

    visit(tree.body)
    for node in ast.walk(tree):  # __all__.extend(...): not literal after all
        if isinstance(node, ast.Attribute) and _dotted(node.value) == "__all__":
            info.all = None
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    aliases = {
        n
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _is_globals(node.value, set())
        for target in node.targets
        for n in _targets(target)
    }
    for node in ast.walk(tree):
        # a binding in any scope may shadow an import (``def f(json): json.``)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            info.rebound.add(node.id)
        elif isinstance(node, ast.arg):
            info.rebound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            info.rebound.add(node.name)
        if isinstance(node, ast.Global):
            for n in node.names:
                bind(n)
        elif isinstance(node, ast.NamedExpr):
            for n in _targets(node.target):
                info.rebound.add(n)
        elif _adds_names(node, aliases, defined):
            info.open = True
    return info


def read_class(node: ast.ClassDef) -> ClassInfo:
    """A class statement's members: its body's bindings, ``__slots__``, and what its
    methods assign or read on their first parameter (``self.x = ...``, ``self.y``)."""
    metaclass = any(k.arg == "metaclass" for k in node.keywords)
    decorated = any(_last(d) not in PLAIN_DECORATORS for d in node.decorator_list)
    info = ClassInfo(node.name, set(), list(node.bases), decorated, metaclass)

    def visit(body: Sequence[ast.stmt]) -> None:
        for item in body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                info.members.add(item.name)
                if item.name in ("__getattr__", "__getattribute__"):
                    info.open = True
                args = [*item.args.posonlyargs, *item.args.args]
                if args:
                    _instance_attributes(item, args[0].arg, info)
            elif isinstance(item, ast.ClassDef):
                info.members.add(item.name)
            elif isinstance(item, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                for target in targets:
                    for n in _targets(target):
                        info.members.add(n)
                        if n == "__slots__" and item.value is not None:
                            info.members.update(_strings(item.value))
                            if "__dict__" in _strings(item.value):
                                info.open = True
            elif isinstance(item, ast.If | ast.Try | ast.With):
                visit(item.body)
                visit(getattr(item, "orelse", []))

    visit(node.body)
    return info


def _strings(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {
            e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
        }
    return set()


def _instance_attributes(func: ast.AST, me: str, info: ClassInfo) -> None:
    """Attributes a method assigns or reads on ``me`` (one it reads exists at run time,
    made by a subclass or a line not yet written); writing its ``__dict__`` or
    ``setattr`` on it makes the class open."""

    def own_dict(node: ast.expr) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "__dict__"
            and isinstance(node.value, ast.Name)
            and node.value.id == me
        )

    for node in ast.walk(func):
        if isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == me:
                info.members.add(node.attr)
            elif node.attr in ("update", "setdefault") and own_dict(node.value):
                info.open = True
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store):
            if own_dict(node.value):
                info.open = True
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and node.args
            and isinstance(node.args[0], ast.Name)
            and node.args[0].id == me
        ):
            info.open = True


def compiled_module(name: str) -> bool:
    """Whether ``name`` is a compiled-in or compiled standard-library module (no source
    to read); imports nothing."""
    if name.split(".")[0] not in sys.stdlib_module_names:
        return False
    if name in sys.builtin_module_names:
        return True
    if "." in name:
        return False
    try:
        spec = importlib.machinery.PathFinder.find_spec(name)
    except (ImportError, ValueError, OSError):
        return False
    return spec is not None and isinstance(spec.loader, importlib.machinery.ExtensionFileLoader)


_CHILD = (
    "import importlib, json, sys\n"
    "try:\n"
    "    names = sorted(dir(importlib.import_module(sys.argv[1])))\n"
    "except Exception:\n"
    "    names = None\n"
    "sys.stdout.write('\\n' + json.dumps(names) + '\\n')\n"
)


def names_in_child(name: str) -> frozenset[str] | None:
    """``dir()`` of the compiled module ``name``, imported in a child interpreter
    (isolated: no site, no environment, no current folder); None where it does not
    import there or the child fails. The names are the output's last line: a module's
    initialisation may write to the terminal before it."""
    if not sys.executable:
        return None
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-S", "-c", _CHILD, name],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=CHILD_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.splitlines()
    if done.returncode != 0 or not lines:
        return None
    try:
        names = json.loads(lines[-1])
    except ValueError:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return frozenset(names)


class Resolver:
    """Finds modules and lists members, with bounded caches of what it read.

    ``find``: the workspace's own modules (``WorkspaceIndex.module_path``) before the
    search path ``paths`` (the workspace's roots and virtual environment first, then this
    interpreter's ``sys.path``). ``clock``: monotonic seconds, for when a module not found
    is looked up again. ``compiled``: the names of a compiled module this process has
    not loaded (``names_in_child``).
    """

    def __init__(
        self,
        find: Callable[[str], Path | None] = lambda _name: None,
        paths: Sequence[str] | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        compiled: Callable[[str], frozenset[str] | None] = names_in_child,
    ) -> None:
        self.find = find
        self.paths = list(sys.path if paths is None else paths)
        self._clock = clock
        self._read_compiled = compiled
        # (file, dotted name, package) -> (mtime, its parse): a file reached under two
        # names reads its relative imports two ways; an edited file replaces its entry
        self._parsed: Lru[tuple[str, str, bool], tuple[float, ModuleInfo | None]] = Lru(
            PARSE_CACHE_BYTES
        )
        # name -> (its file's mtime, its members, when read)
        self._members: Lru[str, tuple[float, frozenset[str] | None, float]] = Lru(MEMBER_SETS)
        # the search path's answers: (file, is a package, when looked up)
        self._locate: Lru[str, tuple[Path | None, bool, float]] = Lru(LOCATIONS)
        self._compiled: Lru[str, tuple[frozenset[str] | None, float]] = Lru(COMPILED_SETS)
        self._refreshed = -MISS_SECONDS  # when the import system's folder caches were emptied
        self.read: dict[str, float] = {}  # every source file looked at: its mtime
        self.missed: set[str] = set()  # every module looked for and no source found

    def stale(self, read: dict[str, float], missed: Iterable[str] = ()) -> bool:
        """Whether a file of ``read`` (a ``read`` taken earlier) changed since, or a
        module of ``missed`` (a ``missed``) is found now (looked up again once
        ``MISS_SECONDS`` passed)."""
        for path, mtime in read.items():
            try:
                if Path(path).stat().st_mtime != mtime:
                    return True
            except OSError:
                return True
        return any(self.locate(name, note=False)[0] is not None for name in missed)

    def locate(self, name: str, *, note: bool = True) -> tuple[Path | None, bool]:
        """``(source file, is a package)``, the file None where there is none; the
        workspace is asked each time (a module made there is found at once), the search
        path again once ``MISS_SECONDS`` passed where it found nothing. ``note``: add a
        module not found to ``missed``."""
        path = self.find(name)
        if path is not None:
            return path, path.name == "__init__.py"
        now = self._clock()
        found = self._locate.get(name)
        if found is None or (found[0] is None and now - found[2] >= MISS_SECONDS):
            if found is not None and now - self._refreshed >= MISS_SECONDS:
                # a folder's listing is cached by its modification time, which a
                # coarse clock may leave unchanged by an install
                importlib.machinery.PathFinder.invalidate_caches()
                self._refreshed = now
            location, package = self._find(name)
            found = (location, package, now)
            self._locate.put(name, found)
        if found[0] is None and note:
            self.missed.add(name)
        return found[0], found[1]

    def held(self) -> dict[str, tuple[int, int]]:
        """Each cache's entries and cost (bytes of source for ``parses``, else entries)."""
        return {
            "parses": (len(self._parsed), self._parsed.cost),
            "members": (len(self._members), self._members.cost),
            "locations": (len(self._locate), self._locate.cost),
            "compiled": (len(self._compiled), self._compiled.cost),
        }

    def _gone(self, name: str) -> None:
        """The file ``name`` was found at is gone (uninstalled, moved): look it up again."""
        self._locate.pop(name)

    def _find(self, name: str) -> tuple[Path | None, bool]:
        search: list[str] | None = self.paths
        spec = None
        parts = name.split(".")
        for i in range(len(parts)):
            if search is None:
                return None, False
            try:
                spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: i + 1]), search)
            except (ImportError, ValueError, OSError, KeyError):
                # KeyError: a namespace package inside one whose parent Python never
                # imported (``_NamespacePath`` reads ``sys.modules``): unknown, as before
                # a completion there failed whole (setuptools' vendored wheel, set F).
                return None, False
            if spec is None:
                return None, False
            locations = spec.submodule_search_locations
            search = list(locations) if locations is not None else None
        if spec is None or not spec.origin or not spec.origin.endswith((".py", ".pyi")):
            return None, bool(spec and spec.submodule_search_locations)
        return Path(spec.origin), spec.submodule_search_locations is not None

    def module(self, name: str) -> ModuleInfo | None:
        """The parsed module ``name`` (None: no source found, it does not parse, or it is
        over ``MAX_SOURCE_BYTES``)."""
        path, package = self.locate(name)
        if path is None:
            return None
        try:
            stat = path.stat()
        except OSError:
            self._gone(name)
            return None
        self.read[str(path)] = stat.st_mtime
        key = (str(path), name, package)
        cached = self._parsed.get(key)
        if cached is not None and cached[0] == stat.st_mtime:
            return cached[1]
        info = None
        if stat.st_size <= MAX_SOURCE_BYTES:
            try:
                tree = ast.parse(path.read_bytes())
                info = read_module(tree, name, package)
            except (SyntaxError, ValueError, OSError, RecursionError, MemoryError):
                pass
        self._parsed.put(
            key, (stat.st_mtime, info), min(stat.st_size, MAX_SOURCE_BYTES) + PARSE_OVERHEAD
        )
        return info

    def alias(self, name: str) -> str | None:
        """The module ``name`` stands for where it is no file but a module's import
        (``os.path`` is ``os``'s ``import posixpath as path``)."""
        parent, _, last = name.rpartition(".")
        info = self.module(parent) if parent else None
        if info is None:
            return None
        if last in info.modules:
            return info.modules[last]
        source = info.imported.get(last)
        if source is not None and self.is_module(f"{source[0]}.{source[1]}"):
            return f"{source[0]}.{source[1]}"
        return None

    def is_module(self, name: str) -> bool:
        path, _ = self.locate(name)
        return path is not None or self.compiled_names(name) is not None

    def compiled_names(self, name: str) -> frozenset[str] | None:
        """``dir()`` of a compiled standard-library module: of the one this process has
        loaded, else read in a child (``compiled``); None for any other module, or one
        that does not import (looked at again once ``MISS_SECONDS`` passed)."""
        if name.split(".")[0] not in sys.stdlib_module_names:
            return None
        now = self._clock()
        cached = self._compiled.get(name)
        if cached is None or (cached[0] is None and now - cached[1] >= MISS_SECONDS):
            names = None
            if compiled_module(name):
                loaded = sys.modules.get(name)  # nothing is imported to read it
                names = self._read_compiled(name) if loaded is None else frozenset(dir(loaded))
            cached = (names, now)
            self._compiled.put(name, cached)
        return cached[0]

    def module_members(self, name: str, depth: int = 0) -> frozenset[str] | None:
        """Every name ``name.`` may be followed by; None where the set is open or the
        module is not found. Cached until the module's file changes (one without a
        file, found or not: until ``MISS_SECONDS`` passed)."""
        stamp = self._stamp(name)
        now = self._clock()
        cached = self._members.get(name)
        fresh = cached is not None and (stamp > 0 or now - cached[2] < MISS_SECONDS)
        if cached is not None and fresh and cached[0] == stamp:
            return cached[1]
        self._members.put(name, (stamp, None, now))  # a cycle of star imports: open
        found = self._module_members(name, depth)
        self._members.put(name, (stamp, found, now))
        return found

    def _stamp(self, name: str) -> float:
        path, _ = self.locate(name)
        if path is None:
            return 0.0
        try:
            self.read[str(path)] = stamp = path.stat().st_mtime
            return stamp
        except OSError:
            self._gone(name)
            return -1.0

    def _module_members(self, name: str, depth: int) -> frozenset[str] | None:
        info = self.module(name)
        if info is None:
            alias = self.alias(name)
            if alias is not None:
                return self.module_members(alias, depth + 1)
            return self.compiled_names(name)
        if info.open or depth > MAX_DEPTH:
            return None
        names = set(info.names) | MODULE_DUNDERS
        stars = [*info.stars, *(s for s in info.maybe_stars if self.is_module(s))]
        for star in stars:
            more = self.module_members(star, depth + 1)
            if more is None:
                return None
            exported = self.module(star)
            if exported is not None and exported.all is not None:
                names.update(exported.all)
            else:
                names.update(n for n in more if not n.startswith("_"))
        if info.package:
            names.update(self.submodules(name))
        return frozenset(names)

    def submodules(self, name: str) -> set[str]:
        path, package = self.locate(name)
        if path is None or not package:
            return set()
        out = set()
        try:
            entries = os.listdir(path.parent)
        except OSError:
            return set()
        for entry in entries:
            stem = entry.split(".")[0]
            if not stem.isidentifier() or stem == "__init__":
                continue
            if entry.endswith((".py", ".pyi", ".so", ".pyd")) or (
                (path.parent / entry / "__init__.py").exists()
            ):
                out.add(stem)
        return out

    def class_members(
        self, info: ModuleInfo, cls: str, depth: int = 0, *, as_class: bool = False
    ) -> frozenset[str] | None:
        """Members of class ``cls`` defined or imported in ``info``'s module, its bases'
        included; None where open. ``as_class``: the receiver is the class itself, whose
        metaclass may add names (a metaclass makes it open)."""
        if depth > MAX_DEPTH:
            return None
        found = info.classes.get(cls)
        if found is None:
            source = info.imported.get(cls)
            if source is None:
                return None
            module, attr = source
            other = self.module(module)
            if other is None:
                return None
            return self.class_members(other, attr, depth + 1, as_class=as_class)
        return self.members_of(info, found, depth, as_class=as_class)

    def members_of(
        self, info: ModuleInfo, found: ClassInfo, depth: int = 0, *, as_class: bool = False
    ) -> frozenset[str] | None:
        """``class_members`` of a class statement read in ``info``'s module (a nested
        class's too)."""
        if found.open or (as_class and found.metaclass):
            return None
        names = set(found.members) | CLASS_DUNDERS
        for base in found.bases:
            more = self.base_members(info, base, depth + 1, as_class=as_class)
            if more is None:
                return None
            names |= more
        return frozenset(names)

    def base_members(
        self, info: ModuleInfo, base: ast.expr, depth: int, *, as_class: bool
    ) -> frozenset[str] | None:
        """Members a base class expression brings, seen from ``info``'s module."""
        if isinstance(base, ast.Subscript):  # Generic[T], list[int]
            base = base.value
        if isinstance(base, ast.Name):
            name = base.id
            if name in info.classes or name in info.imported:
                return self.class_members(info, name, depth, as_class=as_class)
            if name in info.names:
                return None  # bound, but not to a class we can read
            if name == "object":
                return CLASS_DUNDERS
            value = getattr(builtins, name, None)
            if isinstance(value, type):
                return frozenset(dir(value))
            return None
        if isinstance(base, ast.Attribute):
            chain = _dotted(base.value)
            if chain is None:
                return None
            head, _, rest = chain.partition(".")
            module = info.modules.get(head)
            if module is None:
                return None
            other = self.module(module if not rest else f"{module}.{rest}")
            if other is None:
                return None
            return self.class_members(other, base.attr, depth + 1, as_class=as_class)
        return None


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))
