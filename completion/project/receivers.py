"""The receivers at the cursor whose members are known: what the names monitor holds to.

For a Python document and a cursor, ``Receivers.names`` lists each receiver the model may
dereference (``os``, ``os.path``, ``np``, a class, ``self``) with the closed set of names
its members have (``completion/project/members.py``); a receiver whose set is open, or a name
that is bound otherwise than by its import somewhere in the document (``path = ...``
beside ``from os import path``), is left out: the model stays free there. The document
is parsed with the cursor's line replaced by ``pass`` (the line being typed rarely
parses), or, failing that, up to that line; the result is cached by the text around the
cursor's line, so typing on one line parses once.

Where ``__init__`` makes an attribute, the names its class uses and that method makes on
no other line (``unmade``): what weighs the model's pick there (``backends/monitor.py``,
``Prior``).
"""

from __future__ import annotations

import ast
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from kode.backends.monitor import Names
from kode.completion.project.members import ModuleInfo, Resolver, read_class, read_module

# Methods where ``self.`` at the start of a statement likely makes a new attribute: there
# the monitor leaves it free.
CREATING = frozenset({"__init__", "__new__", "__post_init__", "__setstate__", "setUp", "setup"})
MAX_NAMES = 60_000  # all receivers together: a bound on the request's size
MAX_CHAINS = 32  # dotted receivers (``os.path``) read from the document's text
# A use of a name this many lines from the cursor's line weighs half as much as one
# beside it: the code being written uses what the code around it uses.
USE_HALF_LINES = 25.0
# Analyses kept, one per place (the text around the cursor's line): the places a user
# moves between; each holds at most MAX_NAMES names.
_CACHE = 8


@dataclass(frozen=True, slots=True)
class _Analysis:
    members: dict[str, tuple[str, ...]]
    creating: bool
    unmade: dict[str, float]  # where ``self.`` makes an attribute: ``unmade``
    read: dict[str, float]  # the files read for it, by path: their modification times
    missed: frozenset[str]  # the modules it looked for and found no source of


def parse_around(text: str, line_start: int, line_end: int) -> ast.Module | None:
    """The document's syntax tree with the cursor's line (``text[line_start:line_end]``)
    replaced by ``pass`` at its indentation; else the text up to that line; else None.

    >>> tree = parse_around("import os\\nx = os.\\ny = 1\\n", 10, 17)
    >>> [type(n).__name__ for n in tree.body]
    ['Import', 'Pass', 'Assign']
    """
    line = text[line_start:line_end]
    indent = line[: len(line) - len(line.lstrip())]
    stub = f"{indent}pass"
    for candidate in (text[:line_start] + stub + text[line_end:], text[:line_start] + stub):
        try:
            return ast.parse(candidate)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
    return None


def enclosing_method(tree: ast.Module, line: int) -> tuple[ast.ClassDef, str, str] | None:
    """``(class, its method's first parameter, the method's name)`` around 1-based
    ``line``, for a method that has an instance or class as its first parameter."""
    found: tuple[ast.ClassDef, str, str] | None = None
    for cls in _classes(tree):
        if not (cls.lineno <= line <= (cls.end_lineno or cls.lineno)):
            continue
        for item in cls.body:
            if not isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if not (item.lineno <= line <= (item.end_lineno or item.lineno)):
                continue
            decorators = {getattr(d, "id", getattr(d, "attr", "")) for d in item.decorator_list}
            args = [*item.args.posonlyargs, *item.args.args]
            if args and "staticmethod" not in decorators:
                found = (cls, args[0].arg, item.name)  # the innermost class wins (later)
    return found


def scope_imports(tree: ast.Module, line: int) -> list[ast.stmt]:
    """The import statements of the functions around 1-based ``line`` that end above it,
    outermost function first (not those of functions or classes nested elsewhere in them,
    nor of a class body, which its methods do not see).

    >>> tree = ast.parse("def f():\\n    if x:\\n        import os\\n    pass\\n    import re\\n")
    >>> [ast.unparse(n) for n in scope_imports(tree, 4)]
    ['import os']
    """
    found: list[ast.stmt] = []
    scope: ast.AST | None = tree
    while scope is not None:
        function = isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef)
        inner = None  # the function or class around ``line`` one level down
        for node in _own_nodes(scope):
            end = node.end_lineno or node.lineno
            if node.lineno <= line <= end:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    inner = node
            elif function and isinstance(node, ast.Import | ast.ImportFrom) and end < line:
                found.append(node)
        scope = inner
    return found


def _own_nodes(scope: ast.AST) -> Iterator[ast.stmt]:
    """The statements of ``scope`` at any depth of its blocks, nested functions and
    classes given but not entered."""
    stack = list(reversed(getattr(scope, "body", [])))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        blocks = [getattr(node, name, []) for name in ("body", "orelse", "finalbody")]
        blocks += [h.body for h in getattr(node, "handlers", [])]  # except clauses
        blocks += [c.body for c in getattr(node, "cases", [])]  # match cases
        for block in reversed(blocks):
            stack.extend(reversed(block))


def _classes(tree: ast.AST) -> Iterator[ast.ClassDef]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            yield node


def _import_chains(tree: ast.Module) -> Iterator[str]:
    """``a.b`` and ``a.b.c`` of ``import a.b.c`` (``a`` is a binding of its own)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname is None and "." in alias.name:
                    parts = alias.name.split(".")
                    for i in range(2, len(parts) + 1):
                        yield ".".join(parts[:i])


def unmade(cls: ast.ClassDef, me: str, method: str, line: int) -> dict[str, float]:
    """The names ``me.`` (the method's first parameter) reaches in class ``cls`` that
    method ``method`` makes (assigns) on no line but ``line`` (1-based): the attribute
    about to be made there is one the class uses and nothing makes yet. A use ``d``
    lines from ``line`` weighs ``1 / (1 + d / USE_HALF_LINES)``; the classes nested in
    ``cls`` have a ``self`` of their own.

    >>> tree = ast.parse(
    ...     "class C:\\n"
    ...     "    def __init__(self, a):\\n"
    ...     "        self.a = a\\n"
    ...     "        pass\\n"
    ...     "    def f(self):\\n"
    ...     "        return self.a + self.b\\n"
    ... )
    >>> {k: round(v, 2) for k, v in unmade(tree.body[0], "self", "__init__", 4).items()}
    {'b': 0.93}
    """
    making = [
        item
        for item in cls.body
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
        and item.name == method
        and item.lineno <= line <= (item.end_lineno or item.lineno)
    ]
    made = {
        node.attr
        for func in making
        for node in _on(ast.walk(func), me, line)
        if isinstance(node.ctx, ast.Store)
    }
    weights: dict[str, float] = {}
    for node in _on(_walk_class(cls), me, line):
        if node.attr not in made:
            weight = 1.0 / (1.0 + abs(node.lineno - line) / USE_HALF_LINES)
            weights[node.attr] = weights.get(node.attr, 0.0) + weight
    return weights


def _on(nodes: Iterable[ast.AST], me: str, line: int) -> Iterator[ast.Attribute]:
    """The ``me.name`` among ``nodes`` that are not on ``line``."""
    for node in nodes:
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == me
            and node.lineno != line
        ):
            yield node


def _walk_class(cls: ast.ClassDef) -> Iterator[ast.AST]:
    """The nodes of ``cls`` but not of the classes nested in it."""
    todo: list[ast.AST] = list(cls.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.ClassDef):
            continue
        yield node
        todo.extend(ast.iter_child_nodes(node))


class Receivers:
    """``Names`` for a cursor, with a small cache of the documents' analyses."""

    def __init__(self, resolver: Resolver) -> None:
        self.resolver = resolver
        # per text around the cursor's line: what the analysis found there
        self._cache: OrderedDict[tuple[str, int, int], _Analysis] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Analyses held (at most ``_CACHE``)."""
        return len(self._cache)

    def names(
        self, text: str, offset: int, line: str, module: str = "", package: bool = False
    ) -> Names | None:
        """The receivers at ``offset`` of ``text`` (a Python document; ``module``: its
        dotted name, for relative imports), for a generation that begins after ``line``
        (the cursor's line before it). None where none is known."""
        line_start = text.rfind("\n", 0, offset) + 1
        line_end = text.find("\n", offset)
        line_end = len(text) if line_end < 0 else line_end
        key = (module, hash(text[:line_start]), hash(text[line_end:]))
        with self._lock:  # documents' analyses run in threads; one at a time
            cached = self._cache.get(key)
            # a module changed on disk, or one not found before is there now
            if cached is None or self.resolver.stale(cached.read, cached.missed):
                self.resolver.read, self.resolver.missed = {}, set()
                cached = self._analyse(text, line_start, line_end, module, package)
                self._cache[key] = cached
                while len(self._cache) > _CACHE:
                    self._cache.popitem(last=False)
            self._cache.move_to_end(key)
        if not cached.members:
            return None
        if not cached.creating:
            return Names(line, cached.members)
        return Names(line, cached.members, ("self",), {"self": cached.unmade})

    def _analyse(
        self, text: str, line_start: int, line_end: int, module: str, package: bool
    ) -> _Analysis:
        tree = parse_around(text, line_start, line_end)
        if tree is None:
            return _Analysis({}, False, {}, self.resolver.read, frozenset())
        doc = read_module(tree, module, package)
        cursor_line = text.count("\n", 0, line_start) + 1
        # Imports made in the functions around the cursor, above it (``from . import
        # rich_utils`` in the function that uses it: a lazy import) bind there, over the
        # module's.
        scoped = read_module(ast.Module(scope_imports(tree, cursor_line), []), module, package)
        for local in scoped.names:
            doc.modules.pop(local, None)
            doc.imported.pop(local, None)
        doc.modules.update(scoped.modules)
        doc.imported.update(scoped.imported)
        out: dict[str, frozenset[str]] = {}
        resolver = self.resolver
        for local, target in doc.modules.items():
            self._add(out, doc, local, resolver.module_members(target))
        for chain in _import_chains(tree):
            self._add(out, doc, chain, resolver.module_members(chain))
        for local, (source, attr) in doc.imported.items():
            self._add(out, doc, local, self._imported(source, attr))
        for name in doc.classes:
            found = resolver.class_members(doc, name, as_class=True)
            if found is not None and doc.bound.get(name) == 1:  # its only binding
                out[name] = found
        self._chains(out, doc, text)
        creating = False
        made: dict[str, float] = {}
        method = enclosing_method(tree, cursor_line)
        if method is not None:
            node, me, method_name = method
            info = doc.classes.get(node.name) or read_class(node)
            as_class = me == "cls"
            found = resolver.members_of(doc, info, as_class=as_class)
            if found is not None:
                out[me] = found
                creating = method_name in CREATING and not as_class
                if creating:
                    made = unmade(node, me, method_name, cursor_line)
        members: dict[str, tuple[str, ...]] = {}
        total = 0
        for recv, names in out.items():
            total += len(names)
            if total > MAX_NAMES:
                break
            members[recv] = tuple(sorted(names))
        creating = creating and "self" in members
        made = made if creating else {}
        return _Analysis(members, creating, made, self.resolver.read, frozenset(resolver.missed))

    def _add(
        self,
        out: dict[str, frozenset[str]],
        doc: ModuleInfo,
        recv: str,
        found: frozenset[str] | None,
    ) -> None:
        if found is not None and recv.split(".")[0] not in doc.rebound:
            out[recv] = found

    def _imported(self, source: str, attr: str) -> frozenset[str] | None:
        """Members of ``from source import attr``: a submodule, or a class."""
        resolver = self.resolver
        if resolver.is_module(f"{source}.{attr}"):
            return resolver.module_members(f"{source}.{attr}")
        info = resolver.module(source)
        return None if info is None else resolver.class_members(info, attr, as_class=True)

    def _chains(self, out: dict[str, frozenset[str]], doc: ModuleInfo, text: str) -> None:
        """Dotted receivers the document dereferences (``os.path.join``, ``ast.NodeVisitor
        .visit``), where their head is a module receiver: a submodule, a module's import,
        or a class it defines."""
        heads = [r for r in out if r in doc.modules]
        if not heads:
            return
        alternatives = "|".join(map(re.escape, heads))
        pattern = re.compile(rf"(?<![\w.])((?:{alternatives})(?:\.[A-Za-z_]\w*)+)\.")
        seen = 0
        for chain in dict.fromkeys(m.group(1) for m in pattern.finditer(text)):
            if chain in out or seen >= MAX_CHAINS:
                continue
            seen += 1
            head, _, rest = chain.partition(".")
            dotted = f"{doc.modules[head]}.{rest}"
            parent, _, last = dotted.rpartition(".")
            found = self.resolver.module_members(dotted)
            if found is None:
                info = self.resolver.module(parent) or self._aliased(parent)
                if info is not None:
                    found = self.resolver.class_members(info, last, as_class=True)
            self._add(out, doc, chain, found)

    def _aliased(self, name: str) -> ModuleInfo | None:
        alias = self.resolver.alias(name)
        return None if alias is None else self.resolver.module(alias)
