"""``kode bench context``: does project context put the right cross-file name in?

Holes are cut from real multi-module Python packages (the standard library's and the
venv's, never this repository): a one-line statement of module A that uses
``module.NAME`` where ``module`` is a sibling module B of the same package, imported by
A, and NAME is defined at the top of B and written nowhere else in A. NAME is renamed
consistently in a copy of the whole package (``Handler`` -> ``HandlerQuill``), so the
model cannot answer from memory: only context can tell it. The copy is the workspace
folder. The document is A with the hole's line emptied after its indentation; the cursor
sits there, and the answer is the rest of the line.

Conditions (one completion each, greedy, through ``CompletionEngine.complete``):

- ``in-file``: only A is open;
- ``open``: A and an unrelated sibling module open (today's cross-file context);
- ``retrieval``: as ``open``, plus the workspace index over the copy (``retrievalTokens``);
- ``oracle``: as ``open``, plus the defining module open as a tab holding an excerpt from
  NAME's definition on (up to 1,400 characters).

Metrics on the completion's first line: the renamed name appears in it; it equals the
expected line (whitespace-trimmed); edit similarity (1 - Levenshtein / longer length).

``--latency-files N`` also measures the index alone (no model): build time, memory
(tracemalloc's peak and the index's own estimate) and retrieval time per cursor over
the first N source files of a real tree (the standard library, then site-packages).
"""

from __future__ import annotations

import ast
import asyncio
import functools
import itertools
import json
import random
import re
import shutil
import sysconfig
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kode.bench import common
from kode.bench.common import fmt, markdown_table

CONDITIONS = ("in-file", "open", "retrieval", "oracle")
DEFAULT_PACKAGES = (
    *("logging", "email", "http", "json", "concurrent", "importlib", "unittest", "asyncio"),
    *("xmlrpc", "wsgiref", "urllib", "sqlite3", "httpx", "starlette", "jinja2", "pygls"),
)
ORACLE_CHARS = 1400
_SUFFIXES = ("Quill", "Brisk", "Nimbus", "Fable", "Tandem", "Vesper", "Orbit", "Ember")


@dataclass(frozen=True, slots=True)
class Options:
    model: str = "default"
    holes: int = 24
    seed: int = 0
    packages: tuple[str, ...] = DEFAULT_PACKAGES
    conditions: tuple[str, ...] = CONDITIONS
    retrieval_tokens: int = 512
    max_tokens: int = 48
    latency_files: int = 0  # 0: skip the index measurement
    skip_model: bool = False
    threads: int = 0  # llama.cpp threads; 0: every core
    prefix_tokens: int | None = None  # None: the setting's default
    out: Path = Path("results/context")
    resume: bool = False  # keep the results in ``out/partial.jsonl``, run only the rest
    keystrokes: bool = False  # also count snippet changes while the holes' lines are typed
    fitted: bool = False  # also check which holes' names reach the fitted prompt (no model)


@dataclass(frozen=True, slots=True)
class Hole:
    """One cross-file hole, before renaming: line ``line`` of ``module`` (a file of
    package ``package``) uses ``name`` defined in ``defining``."""

    package: str
    module: str  # path relative to the package's parent folder, e.g. logging/handlers.py
    defining: str  # likewise, e.g. logging/__init__.py
    name: str
    line: int  # zero-based


@dataclass(slots=True)
class Result:
    hole: str
    condition: str
    renamed: str
    expected: str
    completion: str
    name_hit: bool
    exact: bool
    similarity: float
    prompt_tokens: int = 0
    ms: float = 0.0
    retrieval_ms: float = 0.0
    error: str = ""


@dataclass(slots=True)
class Row:
    condition: str
    total: int = 0
    names: int = 0
    exact: int = 0
    similarity: list[float] = field(default_factory=list)
    prompt_tokens: list[float] = field(default_factory=list)


# -- pure parts (unit-tested) -----------------------------------------------------------


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert, delete, substitute one character).

    >>> levenshtein("kitten", "sitting")
    3
    """
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def similarity(a: str, b: str) -> float:
    """1 - edit distance / the longer length; 1.0 for two empty strings."""
    longest = max(len(a), len(b))
    return 1.0 if longest == 0 else 1.0 - levenshtein(a, b) / longest


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
    from kode.completion.index_worker import python_definitions
    from kode.completion.retrieval import Binding, python_imports
    from kode.completion.workspace_files import module_name

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


def score(prepared: Prepared, condition: str, completion: str) -> Result:
    first = completion.split("\n", 1)[0].strip()
    return Result(
        hole=hole_key(prepared.hole),
        condition=condition,
        renamed=prepared.renamed,
        expected=prepared.expected,
        completion=first,
        name_hit=re.search(rf"\b{re.escape(prepared.renamed)}\b", first) is not None,
        exact=first == prepared.expected,
        similarity=similarity(first, prepared.expected),
    )


def summarize(results: Iterable[Result]) -> list[Row]:
    rows: dict[str, Row] = {}
    for r in results:
        row = rows.setdefault(r.condition, Row(r.condition))
        row.total += 1
        row.names += r.name_hit
        row.exact += r.exact
        row.similarity.append(r.similarity)
        row.prompt_tokens.append(float(r.prompt_tokens))
    order = {c: i for i, c in enumerate(CONDITIONS)}
    return sorted(rows.values(), key=lambda row: order.get(row.condition, 99))


def gap_closed(rows: Sequence[Row], condition: str = "retrieval") -> float | None:
    """Share of the open -> oracle gap on the name metric that ``condition`` closes."""
    got = {r.condition: r.names for r in rows}
    if not {"open", condition, "oracle"} <= got.keys() or got["oracle"] == got["open"]:
        return None
    return (got[condition] - got["open"]) / (got["oracle"] - got["open"])


def render_table(rows: Sequence[Row]) -> str:
    return markdown_table(
        ["condition", "name in completion", "exact line", "edit similarity", "prompt tokens"],
        [
            [
                r.condition,
                common.fmt_ratio(r.names, r.total),
                common.fmt_ratio(r.exact, r.total),
                fmt(common.mean(r.similarity), 2),
                fmt(common.median(r.prompt_tokens), 0),
            ]
            for r in rows
        ],
    )


def chart(rows: Sequence[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = [
        ("name in completion", [100.0 * r.names / max(r.total, 1) for r in rows]),
        ("exact line", [100.0 * r.exact / max(r.total, 1) for r in rows]),
        ("edit similarity", [100.0 * (common.mean(r.similarity) or 0.0) for r in rows]),
    ]
    width = 0.8 / len(rows)
    fig, ax = plt.subplots(figsize=(7.5, 4.0))
    for k, row in enumerate(rows):
        xs = [i + (k - (len(rows) - 1) / 2) * width for i in range(len(metrics))]
        ax.bar(xs, [values[k] for _, values in metrics], width=width, label=row.condition)
    ax.set_xticks(range(len(metrics)))
    ax.set_xticklabels([name for name, _ in metrics])
    ax.set_ylabel("% of holes (similarity: mean x 100)")
    ax.set_ylim(0, 100)
    ax.set_title("Cross-file holes, renamed names")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- running ----------------------------------------------------------------------------


def source_root(package: str) -> Path | None:
    """The folder holding ``package`` (the standard library, else site-packages)."""
    for key in ("stdlib", "purelib", "platlib"):
        folder = Path(sysconfig.get_paths()[key])
        if (folder / package / "__init__.py").is_file():
            return folder
    return None


def collect(options: Options) -> list[tuple[Hole, Path]]:
    found: list[Hole] = []
    roots: dict[str, Path] = {}
    for package in options.packages:
        root = source_root(package)
        if root is None:
            continue
        roots[package] = root
        found.extend(find_holes(root, package))
    return [(h, roots[h.package]) for h in choose(found, options.holes, options.seed)]


async def _complete(
    engine: Any, prepared: Prepared, opened: list[tuple[Path, str]], max_tokens: int
) -> tuple[str, int]:
    """Open ``opened`` (oldest first) and the module, complete at the hole, close all."""
    uri = (prepared.root / prepared.hole.module).as_uri()
    uris = [path.as_uri() for path, _ in opened]
    try:
        for other, (_, text) in zip(uris, opened, strict=True):
            engine.documents.open(other, text, 0, "python")
        engine.documents.open(uri, prepared.document, 0, "python")
        position = engine.documents.get(uri).position_at(prepared.offset)
        done = await engine.complete(uri, position, max_tokens=max_tokens)
        return done.text, done.stats.prompt_tokens
    finally:
        await engine.cancel(uri)
        for other in [*uris, uri]:
            engine.documents.close(other)


def load_partial(path: Path) -> list[Result]:
    """The results a stopped run wrote to ``path`` (``partial.jsonl``), errors left out
    so that they run again; [] when there is none."""
    if not path.is_file():
        return []
    out: list[Result] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            result = Result(**json.loads(line))
            if not result.error:
                out.append(result)
    return out


def hole_key(hole: Hole) -> str:
    """A hole as ``Result.hole`` names it."""
    return f"{hole.module}:{hole.line + 1}"


def _append(path: Path, record: dict[str, Any]) -> None:
    """One result more in ``path``: a long run keeps what it measured if stopped."""
    common.prepare_out(path.parent)
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def _built_index(prepared: Prepared) -> Any:
    """The workspace index of a hole's renamed copy, built, its parsing child closed
    (nothing is re-indexed during a hole)."""
    from kode.completion.workspace import WorkspaceIndex

    index = WorkspaceIndex([prepared.root])
    index.build()
    index.close()
    return index


def _hole_retriever(prepared: Prepared) -> tuple[Any, Path]:
    """A retriever over the hole's built index, and the edited module's path."""
    from kode.completion.index_worker import read_text
    from kode.completion.retrieval import Retriever
    from kode.completion.workspace import IndexLimits

    limit = IndexLimits().max_file_bytes
    retriever = Retriever(_built_index(prepared), functools.partial(read_text, max_bytes=limit))
    return retriever, (prepared.root / prepared.hole.module).resolve()


async def _one_hole(
    options: Options,
    engine: Any,
    prepared: Prepared,
    bar: Any,
    results: list[Result],
    conditions: Sequence[str],
) -> None:
    sibling = prepared.sibling
    opened = [] if sibling is None else [(sibling, sibling.read_text(encoding="utf-8"))]
    index = _built_index(prepared)
    for condition in conditions:
        docs = [] if condition == "in-file" else list(opened)
        if condition == "oracle":
            docs.append((prepared.root / prepared.hole.defining, prepared.defining_excerpt))
        engine.project.index = index if condition == "retrieval" else None
        started = time.perf_counter()
        retrieval_ms = 0.0
        if condition == "retrieval":
            uri = (prepared.root / prepared.hole.module).as_uri()
            backend = await engine.backend()
            t0 = time.perf_counter()
            await engine.retrieve(uri, prepared.document, prepared.offset, backend)
            retrieval_ms = (time.perf_counter() - t0) * 1000.0
        try:
            text, prompt_tokens = await _complete(engine, prepared, docs, options.max_tokens)
            result = score(prepared, condition, text)
            result.prompt_tokens = prompt_tokens
        except Exception as exc:  # one broken hole must not end the run
            result = score(prepared, condition, "")
            result.error = f"{type(exc).__name__}: {exc}"
        result.ms = (time.perf_counter() - started) * 1000.0
        result.retrieval_ms = retrieval_ms
        results.append(result)
        await asyncio.to_thread(_append, options.out / "partial.jsonl", asdict(result))
        bar.update(1)
    engine.project.index = None


async def measure(options: Options) -> tuple[list[Result], dict[str, str]]:
    from kode.completion.backend_factory import BackendPool, load_backend
    from kode.completion.engine import CompletionEngine
    from kode.completion.settings import parse

    facts = {"machine_before": common.machine_note()}
    settings, problems = parse(
        {
            "model": options.model,
            "engine": "inProcess",  # one process measures, no shared engine
            "retrievalTokens": options.retrieval_tokens,
            "movedSuffixDrift": 0,
            "readAhead": False,
            "prefetch": False,
            "threads": options.threads,
            # Only the first line is scored, and greedy decoding writes the same first
            # line whether or not it may go on: stop there.
            "multiline": "never",
            # The full window every time: the latency budget would answer from a short
            # window without any other file once the prefill speed is known.
            "firstAnswerMs": 0,
            **({} if options.prefix_tokens is None else {"prefixTokens": options.prefix_tokens}),
        }
    )
    if problems:
        raise ValueError("; ".join(problems))
    chosen = collect(options)
    facts["holes"] = str(len(chosen))
    partial = options.out / "partial.jsonl"
    results = load_partial(partial) if options.resume else []
    if not options.resume and partial.exists():
        partial.unlink()
    keys = {hole_key(hole) for hole, _ in chosen}
    results = [r for r in results if r.hole in keys and r.condition in options.conditions]
    done = {(r.hole, r.condition) for r in results}
    todo = [
        (hole, root, [c for c in options.conditions if (hole_key(hole), c) not in done])
        for hole, root in chosen
    ]
    todo = [item for item in todo if item[2]]
    pool = BackendPool(load_backend)
    engine = CompletionEngine(pool.get, settings)
    bar = common.progress(sum(len(conditions) for _, _, conditions in todo), "context")
    try:
        if todo:
            await engine.backend()
        for hole, root, conditions in todo:
            with tempfile.TemporaryDirectory(prefix="kode-context-") as tmp:
                prepared = await asyncio.to_thread(prepare, hole, root, Path(tmp), options.seed)
                bar.set_postfix_str(f"{hole.module} {hole.name}", refresh=False)
                await _one_hole(options, engine, prepared, bar, results, conditions)
    finally:
        bar.close()
        await engine.aclose()
        await pool.aclose()
    facts["machine_after"] = common.machine_note()
    return results, facts


# -- snippets while a line is typed (no model) ------------------------------------------


def typing_changes(snippets: Sequence[tuple[tuple[str, str], ...]]) -> tuple[int, int]:
    """For the snippets at the resting cursor (``snippets[0]``, what background
    preparation evaluates while the user reads) and after each keystroke: how many
    keystrokes changed them from the previous one, and how many saw other snippets than
    the prepared ones (each such keystroke must evaluate the prompt again from the first
    changed snippet on, or answer from a shorter window).

    >>> a, b = (("m.py", "x"),), (("m.py", "x"), ("n.py", "y"))
    >>> typing_changes([a, a, a, b, b])
    (1, 2)
    """
    changed = sum(1 for x, y in itertools.pairwise(snippets) if x != y)
    differs = sum(1 for x in snippets[1:] if x != snippets[0])
    return changed, differs


def measure_keystrokes(options: Options) -> dict[str, Any]:
    """Retype each hole's line, key by key, in its renamed workspace copy and count the
    keystrokes whose retrieved snippets differ from the line's start (``typing_changes``)."""
    keys = changed = differs = lines_changed = 0
    measure, budget = _measure(options)
    for hole, root in collect(options):
        with tempfile.TemporaryDirectory(prefix="kode-context-") as tmp:
            prepared = prepare(hole, root, Path(tmp), options.seed)
            retriever, path = _hole_retriever(prepared)
            before = prepared.document[: prepared.offset]
            after = prepared.document[prepared.offset :]
            seen: list[tuple[tuple[str, str], ...]] = []
            for i in range(len(prepared.expected) + 1):
                text = before + prepared.expected[:i] + after
                got = retriever.retrieve(path, text, prepared.offset + i, budget, measure=measure)
                seen.append(tuple((r.snippet.path, r.snippet.text) for r in got))
            c, d = typing_changes(seen)
            keys += len(seen) - 1
            changed += c
            differs += d
            lines_changed += bool(c)
    return {
        "measured in": _unit(measure),
        "keystrokes": keys,
        "keystrokes that changed the snippets": changed,
        "keystrokes whose snippets differ from the prepared ones": differs,
        "lines with any change": lines_changed,
    }


def _measure(options: Options) -> tuple[Any, int]:
    """How the engine counts the retrieval budget: ``options.model``'s tokens (its
    tokenizer only, no weights), else characters, 4 a token (no model installed)."""
    from kode.completion.retrieval import CHARS, Measure

    count = token_counter(options.model)
    if count is None:
        return CHARS, options.retrieval_tokens * 4
    return Measure.tokens(count), options.retrieval_tokens


def _unit(measure: Any) -> str:
    from kode.completion.retrieval import CHARS

    return "characters (4 a token)" if measure is CHARS else "model tokens"


@functools.cache
def token_counter(model: str) -> Any:
    """``model``'s token count (the tokenizer loaded without the weights), or None when
    the model is not installed."""
    try:
        from kode.backends import models
        from kode.backends.llama.runtime import LlamaModel

        path = models.resolve(model, auto_install=False)
        vocab = LlamaModel(path, vocab_only=True)
    except Exception:
        return None

    def count(text: str) -> int:
        return len(vocab.tokenize(text))

    return functools.lru_cache(maxsize=16384)(count)


def measure_fitted(options: Options) -> dict[str, Any]:
    """For each hole, the retrieval condition's prompt as the engine fits it (the sibling
    open, ``retrievalTokens`` of the model's tokens; no weights, no completion): does the
    renamed name reach it, and what the retrieved part holds."""
    from kode.completion import context as ctxmod
    from kode.completion.documents import Document
    from kode.completion.retrieval import Source
    from kode.completion.settings import parse
    from kode.completion.windows import prompt_budget

    count = token_counter(options.model)
    if count is None:
        return {"fitted": "the model's tokenizer is not installed"}
    measure, budget = _measure(options)
    settings, problems = parse(
        {
            "retrievalTokens": options.retrieval_tokens,
            **({} if options.prefix_tokens is None else {"prefixTokens": options.prefix_tokens}),
        }
    )
    assert not problems, problems
    hits: list[str] = []
    misses: list[str] = []
    definitions = tokens = 0
    holes = collect(options)
    for hole, root in holes:
        with tempfile.TemporaryDirectory(prefix="kode-context-") as tmp:
            prepared = prepare(hole, root, Path(tmp), options.seed)
            retriever, path = _hole_retriever(prepared)
            got = retriever.retrieve(
                path, prepared.document, prepared.offset, budget, measure=measure
            )
            sibling = prepared.sibling
            others = [] if sibling is None else [Document(sibling.as_uri(), sibling.read_text())]
            doc = Document(path.as_uri(), prepared.document)
            fit = prompt_budget(settings, options.max_tokens)
            opened = ctxmod.gather(doc, prepared.offset, count, fit, others=others).snippets
            ctx = ctxmod.gather(doc, prepared.offset, count, fit, others=others, retrieved=got)
            kept = ctx.snippets[len(opened) :]
            text = "".join(s.text for s in kept)
            (hits if re.search(rf"\b{re.escape(prepared.renamed)}\b", text) else misses).append(
                prepared.renamed
            )
            shown = {s.text for s in kept}
            definitions += sum(
                1 for r in got if r.source is Source.DEFINITION and r.snippet.text in shown
            )
            tokens += sum(count(s.text) + 8 for s in kept)
    return {
        "holes": len(holes),
        "renamed name in the fitted retrieved context": len(hits),
        "misses": ", ".join(misses),
        "definitions kept whole (all holes)": definitions,
        "retrieved tokens per hole (mean)": round(tokens / max(len(holes), 1), 1),
    }


# -- the index alone --------------------------------------------------------------------


def latency_tree() -> list[Path]:
    """A real tree: the standard library, then site-packages, walked as workspace folders
    (the index's ``max_files`` cuts it)."""
    roots = [Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])]
    return [r for r in roots if r.is_dir()]


def measure_index(n_files: int, queries: int, seed: int, model: str = "default") -> dict[str, Any]:
    """Build an index of ``n_files`` real files, then time retrieval at ``queries``
    random cursors of random indexed Python files (no model; the budget counted in
    ``model``'s tokens, as the engine does, when its tokenizer is installed)."""
    import tracemalloc

    from kode.completion.index_worker import read_text
    from kode.completion.retrieval import Retriever
    from kode.completion.workspace import IndexLimits, WorkspaceIndex

    roots = latency_tree()
    tracemalloc.start()
    index = WorkspaceIndex(roots, IndexLimits(max_files=n_files))
    build_cpu = time.process_time()
    stats = index.build()
    build_cpu = time.process_time() - build_cpu
    child_mb = round(index.worker_peak_kb / 1024, 1)
    index.close()
    _, peak = tracemalloc.get_traced_memory()
    current, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rng = random.Random(seed)
    files = sorted(p for root in roots for p in root.rglob("*.py") if index.entry(p) is not None)
    retriever = Retriever(index, lambda p: read_text(p, index.limits.max_file_bytes))
    measure, budget = _measure(Options(model=model))
    times: list[float] = []
    cpu: list[float] = []
    chars: list[float] = []
    for path in rng.sample(files, min(queries, len(files))):
        text = read_text(path, index.limits.max_file_bytes) or ""
        offset = rng.randrange(len(text) + 1)
        started, started_cpu = time.perf_counter(), time.thread_time()
        got = retriever.retrieve(path, text, offset, budget, measure=measure)
        times.append((time.perf_counter() - started) * 1000.0)
        cpu.append((time.thread_time() - started_cpu) * 1000.0)
        chars.append(float(sum(len(r.snippet.text) for r in got)))
    return {
        "files": stats.files,
        "words": stats.words,
        "postings": stats.postings,
        "build_s": round(stats.build_s, 2),
        "build_cpu_s in this process (traced)": round(build_cpu, 2),
        "truncated": stats.truncated,
        "skipped": [stats.skipped_ignored, stats.skipped_binary, stats.skipped_large],
        "approx_mb": round(stats.approx_bytes / 1e6, 1),
        "traced_mb": round(current / 1e6, 1),
        "traced_peak_mb": round(peak / 1e6, 1),
        "parsed in child / here": [stats.parsed_in_child, stats.parsed_here],
        "child_peak_rss_mb": child_mb,
        "queries": len(times),
        "wall_p50_ms": common.percentile(times, 50),
        "wall_p95_ms": common.percentile(times, 95),
        "wall_max_ms": max(times) if times else None,
        "cpu_p50_ms": common.percentile(cpu, 50),
        "cpu_p95_ms": common.percentile(cpu, 95),
        "cpu_max_ms": max(cpu) if cpu else None,
        "load_after": common.machine_note(),
        "measured in": _unit(measure),
        "mean_chars": common.mean(chars),
    }


def report(
    options: Options,
    results: list[Result],
    facts: dict[str, str],
    index: dict[str, Any] | None,
    typing: dict[str, Any] | None = None,
) -> str:
    out = common.prepare_out(options.out)
    rows = summarize(results)
    table = render_table(rows) if rows else ""
    closed = gap_closed(rows)
    lines = ["# Project context: cross-file holes with renamed names", ""]
    if rows:
        lines += [
            f"- model: {options.model}; {facts.get('holes')} holes (seed {options.seed}) from "
            f"{', '.join(options.packages)}; retrievalTokens {options.retrieval_tokens}; "
            f"prefixTokens {options.prefix_tokens or 'default'}; threads {options.threads}; "
            f"greedy, max {options.max_tokens} tokens",
            f"- retrieval closes {fmt(None if closed is None else 100 * closed, 0)}% of the "
            "open -> oracle gap on the name metric",
            f"- machine: before {facts.get('machine_before')}; after {facts.get('machine_after')}",
            "",
            table,
            "",
        ]
    if index is not None:
        lines += ["## Index", "", "```", *(f"{k}: {v}" for k, v in index.items()), "```", ""]
    if typing is not None:
        lines += [
            "## Snippets while the holes' lines are typed (no model)",
            "",
            "```",
            *(f"{k}: {v}" for k, v in typing.items()),
            "```",
            "",
        ]
    text = "\n".join(lines)
    (out / "report.md").write_text(text, encoding="utf-8")
    common.write_jsonl(out / "results.jsonl", (asdict(r) for r in results))
    if rows:
        chart(rows, out / "context.png")
    return text


def complete_holes(results: Iterable[Result], conditions: Sequence[str]) -> list[Result]:
    """The results of the holes measured in every one of ``conditions`` (so that the
    counts of two conditions compare the same holes)."""
    results = list(results)
    have: dict[str, set[str]] = {}
    for r in results:
        have.setdefault(r.hole, set()).add(r.condition)
    return [r for r in results if set(conditions) <= have[r.hole]]


def pool(folders: Sequence[Path]) -> str:
    """The tables of earlier runs (``partial.jsonl`` in each folder), each alone and all
    pooled, counting only the holes measured in open, retrieval and oracle; no model."""
    needed = ("open", "retrieval", "oracle")
    lines: list[str] = []
    every: list[Result] = []
    for folder in [*folders, None]:
        if folder is None:
            results, title = every, "pooled"
        else:
            results = load_partial(folder / "partial.jsonl")
            every += results
            title = str(folder)
        rows = summarize(complete_holes(results, needed))
        if not rows:
            lines += [f"## {title}: no hole measured in {', '.join(needed)}", ""]
            continue
        closed = {r.condition: gap_closed(rows, r.condition) for r in rows}
        lines += [
            f"## {title}: {rows[0].total} holes",
            "",
            render_table(rows),
            "",
            *(
                f"{c} closes {fmt(100 * share, 0)}% of the open -> oracle gap (names)"
                for c, share in closed.items()
                if c.startswith("retrieval") and share is not None
            ),
            "",
        ]
    return "\n".join(lines)


def main(options: Options) -> int:
    index = None
    if options.latency_files:
        index = measure_index(options.latency_files, 200, options.seed, options.model)
    typing = measure_keystrokes(options) if options.keystrokes else None
    if options.fitted:
        fitted = measure_fitted(options)
        typing = {**(typing or {}), **fitted}
    results: list[Result] = []
    facts: dict[str, str] = {}
    if not options.skip_model:
        results, facts = asyncio.run(measure(options))
    print(report(options, results, facts, index, typing))
    print(f"report: {options.out / 'report.md'}  chart: {options.out / 'context.png'}")
    return 0
