"""The holes of ``kode bench context``: where a module uses a sibling module's name, and
the renamed copy of its package that the model completes in (pure but for the copy;
``bench/context.py`` says why names are renamed).

A hole is a one-line statement of module A that uses ``module.NAME``, ``module`` a
sibling module B of the same package imported by A, NAME defined at the top of B and
written nowhere else in A. ``prepare`` copies the package and renames NAME in every file
(``Handler`` -> ``HandlerQuill``), so that only context can tell the model the name.
"""

from __future__ import annotations

import ast
import random
import re
import shutil
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ORACLE_CHARS = 1400
_SUFFIXES = ("Quill", "Brisk", "Nimbus", "Fable", "Tandem", "Vesper", "Orbit", "Ember")


@dataclass(frozen=True, slots=True)
class Hole:
    """One cross-file hole, before renaming: line ``line`` of ``module`` (a file of
    package ``package``) uses ``name`` defined in ``defining``."""

    package: str
    module: str  # path relative to the package's parent folder, e.g. logging/handlers.py
    defining: str  # likewise, e.g. logging/__init__.py
    name: str
    line: int  # zero-based


def new_name(name: str, taken: set[str], rng: random.Random) -> str:
    """A name the model cannot know, in the style of ``name``: ``Handler`` ->
    ``HandlerQuill``, ``make_msgid`` -> ``make_msgid_quill``, ``NOTSET`` -> ``NOTSET_QUILL``."""
    for suffix in rng.sample(_SUFFIXES, len(_SUFFIXES)):
        if name.isupper():
            candidate = f"{name}_{suffix.upper()}"
        elif "_" in name or name.islower():
            candidate = f"{name}_{suffix.lower()}"
        else:
            candidate = f"{name}{suffix}"
        if candidate not in taken:
            return candidate
    raise ValueError(f"no fresh name for {name}")


def rename(text: str, old: str, new: str) -> str:
    """Every whole-word ``old`` in ``text`` becomes ``new``."""
    return re.sub(rf"\b{re.escape(old)}\b", new, text)


def find_holes(root: Path, package: str) -> list[Hole]:
    """Holes in package ``root/package``: ``mod.NAME`` in a one-line simple statement of
    one module, ``mod`` an imported sibling module defining NAME at top level, NAME
    written nowhere else in that module."""
    from kode.completion.project.index_worker import python_definitions
    from kode.completion.project.retrieval import Binding, python_imports
    from kode.completion.project.workspace_files import module_name

    files = sorted(
        p
        for p in (root / package).rglob("*.py")
        if not {"test", "tests"} & set(p.relative_to(root).parts)
    )
    modules: dict[str, Path] = {}
    for path in files:
        dotted = module_name(path.relative_to(root))
        if dotted is not None:
            modules[dotted] = path
    texts = {path: path.read_text(encoding="utf-8", errors="replace") for path in files}
    definitions = {
        path: {n for n in python_definitions(text) if "." not in n and len(n) >= 4}
        for path, text in texts.items()
    }
    holes: list[Hole] = []
    for path, text in texts.items():
        dotted = module_name(path.relative_to(root))
        if dotted is None:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        bindings = python_imports(text, dotted, path.stem == "__init__")
        targets: dict[str, Path] = {}
        for local, binding in bindings.items():
            target = _module_file(modules, binding)
            if target is not None and target != path:
                targets[local] = target
        lines = text.splitlines()
        seen: set[str] = set()
        for stmt in ast.walk(tree):
            if not isinstance(stmt, ast.stmt) or _compound(stmt):
                continue
            if stmt.lineno != stmt.end_lineno:
                continue
            line = lines[stmt.lineno - 1]
            if not 8 <= len(line.strip()) <= 100:
                continue
            for node in ast.walk(stmt):
                if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
                    continue
                target = targets.get(node.value.id)
                name = node.attr
                if target is None or name not in definitions[target] or name in seen:
                    continue
                if name.startswith("__") or _count_word(text, name) != _count_word(line, name):
                    continue
                seen.add(name)
                holes.append(
                    Hole(
                        package=package,
                        module=path.relative_to(root).as_posix(),
                        defining=target.relative_to(root).as_posix(),
                        name=name,
                        line=stmt.lineno - 1,
                    )
                )
    _ = Binding  # the import above documents what ``bindings`` holds
    return holes


def _module_file(modules: dict[str, Path], binding: Any) -> Path | None:
    if binding.attr is not None:
        return modules.get(f"{binding.module}.{binding.attr}")
    return modules.get(binding.module)


def _compound(stmt: ast.stmt) -> bool:
    compound = (ast.If, ast.For, ast.While, ast.With, ast.Try, ast.FunctionDef, ast.ClassDef)
    return isinstance(stmt, (*compound, ast.AsyncFor, ast.AsyncWith, ast.AsyncFunctionDef))


def _count_word(text: str, word: str) -> int:
    return len(re.findall(rf"\b{re.escape(word)}\b", text))


def choose(holes: Sequence[Hole], n: int, seed: int) -> list[Hole]:
    """``n`` holes, seeded, spread over packages (round robin) and modules (at most two
    per module)."""
    rng = random.Random(seed)
    by_package: dict[str, list[Hole]] = {}
    for hole in holes:
        by_package.setdefault(hole.package, []).append(hole)
    for items in by_package.values():
        rng.shuffle(items)
    chosen: list[Hole] = []
    per_module: dict[str, int] = {}
    while len(chosen) < n and any(by_package.values()):
        for items in by_package.values():
            while items:
                hole = items.pop()
                if per_module.get(hole.module, 0) < 2:
                    per_module[hole.module] = per_module.get(hole.module, 0) + 1
                    chosen.append(hole)
                    break
            if len(chosen) >= n:
                break
    return chosen


@dataclass(frozen=True, slots=True)
class Prepared:
    """A hole in its renamed workspace copy."""

    hole: Hole
    root: Path
    renamed: str
    document: str  # module text with the hole line emptied after its indentation
    offset: int
    expected: str
    defining_excerpt: str
    sibling: Path | None


def prepare(hole: Hole, source_root: Path, work: Path, seed: int) -> Prepared:
    """Copy the hole's package under ``work``, rename NAME in every file of the copy."""
    rng = random.Random(f"{seed}:{hole.module}:{hole.name}")
    target = work / hole.package
    shutil.copytree(
        source_root / hole.package,
        target,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"),
    )
    texts = {p: p.read_text(encoding="utf-8", errors="replace") for p in target.rglob("*.py")}
    taken = {w for text in texts.values() for w in re.findall(r"\w+", text)}
    renamed = new_name(hole.name, taken, rng)
    for path, text in texts.items():
        if re.search(rf"\b{re.escape(hole.name)}\b", text):
            path.write_text(rename(text, hole.name, renamed), encoding="utf-8")
    module_text = (work / hole.module).read_text(encoding="utf-8")
    lines = module_text.splitlines(keepends=True)
    line = lines[hole.line]
    indent = line[: len(line) - len(line.lstrip())]
    expected = line.strip()
    before = "".join(lines[: hole.line]) + indent
    after = "\n" + "".join(lines[hole.line + 1 :])
    defining_text = (work / hole.defining).read_text(encoding="utf-8")
    match = re.search(
        rf"^[ \t]*(?:def|class|async def)[ \t]+{re.escape(renamed)}\b|^{re.escape(renamed)}\b",
        defining_text,
        re.MULTILINE,
    )
    start = match.start() if match else 0
    excerpt = defining_text[start : start + ORACLE_CHARS]
    siblings = sorted(
        p
        for p in (work / hole.module).parent.glob("*.py")
        if p.name not in ("__init__.py", Path(hole.module).name, Path(hole.defining).name)
    )
    sibling = rng.choice(siblings) if siblings else None
    return Prepared(hole, work, renamed, before + after, len(before), expected, excerpt, sibling)


def source_root(package: str) -> Path | None:
    """The folder holding ``package`` (the standard library, else site-packages)."""
    for key in ("stdlib", "purelib", "platlib"):
        folder = Path(sysconfig.get_paths()[key])
        if (folder / package / "__init__.py").is_file():
            return folder
    return None


def collect(packages: Sequence[str], n: int, seed: int) -> list[tuple[Hole, Path]]:
    """``n`` holes (``choose``) of ``packages`` found where Python finds them, each with
    the folder holding its package."""
    found: list[Hole] = []
    roots: dict[str, Path] = {}
    for package in packages:
        root = source_root(package)
        if root is None:
            continue
        roots[package] = root
        found.extend(find_holes(root, package))
    return [(h, roots[h.package]) for h in choose(found, n, seed)]


def hole_key(hole: Hole) -> str:
    """A hole as ``Result.hole`` names it."""
    return f"{hole.module}:{hole.line + 1}"
