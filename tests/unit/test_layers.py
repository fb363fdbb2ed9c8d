"""The house rules that a reader of one file cannot see (issue #51): imports point one way
(editors -> lsp -> completion -> backends), no import circle inside completion/ or
backends/ (TYPE_CHECKING and function-level imports count: they are circles all the
same), and no module reads another object's private members (``other._name``)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("lsp", "completion", "backends", "serve", "cli", "bench")
# Where a name with a leading underscore is the library's own spelling, not a private
# member of ours: namedtuple's ``_asdict``/``_replace``/``_fields``, and the modules
# whose private names Kode reads on purpose, each with its reason.
ALLOWED_PRIVATE = {
    "_asdict",  # namedtuple API
    "_replace",  # namedtuple API
    "_fields",  # namedtuple API
    "_exit",  # os._exit: ending a process that must not wait for its threads
    "_server",  # pygls' LanguageClient keeps its server process there (bench/client.py)
    "_Hash",  # hashlib's hash object type: typeshed has no public name for it
}


def modules(folder: str) -> Iterator[tuple[str, Path]]:
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        yield "kode." + ".".join(parts), path


def imports(name: str, path: Path) -> set[str]:
    """The ``kode.*`` modules ``path`` imports, anywhere in it."""
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("kode."))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            if not base.startswith("kode."):
                continue
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
    return found


def graph(folder: str) -> dict[str, set[str]]:
    known = dict(modules(folder))
    return {name: imports(name, path) & known.keys() for name, path in known.items()}


def cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``edges``, or None.

    >>> cycle({"a": {"b"}, "b": {"a"}})
    ['a', 'b', 'a']
    >>> cycle({"a": {"b"}, "b": set()}) is None
    True
    """
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_the_cycle_finder_finds_a_circle() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_no_import_circle_in_completion_or_backends() -> None:
    for folder in ("completion", "backends"):
        assert cycle(graph(folder)) is None, folder


def test_imports_point_one_way() -> None:
    below = {"lsp": ("kode.serve", "kode.cli"), "completion": ("kode.lsp",), "backends": ()}
    below["completion"] += ("kode.serve", "kode.cli", "kode.bench")
    below["backends"] += ("kode.completion", "kode.lsp", "kode.serve", "kode.cli", "kode.bench")
    for folder, forbidden in below.items():
        for name, path in modules(folder):
            wrong = sorted(i for i in imports(name, path) if i.startswith(forbidden))
            assert not wrong, f"{name} imports {wrong}"


def private_reads(path: Path) -> list[str]:
    """``other._name`` in ``path``: a member read on anything but ``self``, ``cls``
    or a module-level name of the file itself."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or attr.startswith("__") or attr in ALLOWED_PRIVATE:
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and owner.id in {"self", "cls"}:
            continue
        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: .{attr}")
    return found


def same_class_reads(path: Path) -> set[int]:
    """Lines where a method reads a private member of another instance of its own class
    (``other._rules`` in ``_Rules.merged``): a class's own members, not a reach-in."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines: set[int] = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        own = {
            t.attr
            for n in ast.walk(cls)
            if isinstance(n, ast.Assign | ast.AnnAssign)
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Attribute)
            and isinstance(t.value, ast.Name)
            and t.value.id == "self"
        }
        for n in ast.walk(cls):
            if isinstance(n, ast.Attribute) and n.attr in own:
                lines.add(n.lineno)
    return lines


def test_no_module_reads_another_objects_private_members() -> None:
    found = []
    for folder in PRODUCT:
        for _name, path in modules(folder):
            mine = same_class_reads(path)
            found += [f for f in private_reads(path) if int(f.split(":")[1]) not in mine]
    assert not found, "\n".join(found)


def test_every_package_is_installed() -> None:
    """A folder of modules missing from pyproject.toml's ``packages`` works in a checkout
    (the editable install) and is missing from a wheel."""
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    for folder in PRODUCT:
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT).parts
            assert "kode." + ".".join(parts) in listed, init.parent
