"""``kode bench names``: the first name after ``receiver.``, with and without the monitor.

Holes are cut from large standard-library packages: a line that dereferences a receiver
whose members the analysis knows (``completion/project/receivers.py``: a module, a class,
``self``), the cursor right after the dot, the rest of the line removed. The model
completes it three times per window, side by side on one loaded model, greedy: ``free``
(no monitor), ``mask`` (the monitor's mask alone) and ``monitor`` (as shipped: the mask,
and where ``__init__`` makes an attribute the names the class uses and makes nowhere
else weighed, ``Names.unmade`` in ``backends/monitor.py``). The first
identifier it writes is judged against what Python itself says, not against the
analysis: the file's module is imported and the receiver evaluated in it (``dir()``; for
``self`` the class's ``dir()`` and the attributes its MRO's methods assign), so an
analysis that allowed too little or too much shows.

    exact     the identifier the file has
    exists    a member of the receiver (exact included)
    invented  a name the receiver does not have
    open      of those invented, how many at an open site (``self.`` beginning a
              statement in ``__init__``: the monitor masks nothing there)
    empty     no identifier (the model wrote something else, or stopped)

Windows: ``full`` (1024 prefix and 64 suffix tokens, the settings' defaults) and
``short`` (48 prefix and 16 suffix tokens: what the 1 s first-answer budget leaves a
fresh place on a small CPU). The cost of a constrained step is the monitor's own time
(judging the row and masking the logits) per pick made under a mask, beside the decode
time per token with and without the monitor.
"""

from __future__ import annotations

import ast
import asyncio
import dataclasses
import importlib
import inspect
import json
import random
import re
import sys
import sysconfig
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from kode.backends import models
from kode.backends.base import GenerationRequest, SpeculationMethod
from kode.backends.llama.backend import LlamaBackend
from kode.backends.monitor import Names, in_code
from kode.completion.project.members import Resolver
from kode.completion.project.receivers import Receivers, enclosing_method, parse_around
from kode.completion.templates import TEMPLATES, render

# Held out: packages no earlier probe of the project cut holes from.
DEFAULT_PACKAGES = (
    "email", "http", "logging", "asyncio", "xml", "unittest", "importlib",
    "multiprocessing", "urllib", "json", "concurrent", "sqlite3", "wsgiref",
)  # fmt: skip
WINDOWS = {"full": (1024, 64), "short": (48, 16)}
_DEREF = re.compile(r"(?<![\w.])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\.([A-Za-z_]\w*)")
_IDENT = re.compile(r"[A-Za-z_]\w*")


@dataclass(frozen=True, slots=True)
class Options:
    model: str = "small"
    holes: int = 24
    seed: int = 0
    packages: tuple[str, ...] = DEFAULT_PACKAGES
    windows: tuple[str, ...] = ("full", "short")
    max_tokens: int = 12
    threads: int = 0
    out: Path = Path("results/names")


@dataclass(slots=True)
class Hole:
    file: str
    module: str
    line: int
    receiver: str
    expected: str
    before: str
    after: str
    names: Names
    truth: frozenset[str]  # what Python says the receiver has

    @property
    def open_site(self) -> bool:
        """Where the monitor masks nothing: ``self.`` beginning a statement where new
        attributes are made."""
        return self.names.opens(self.before[self.before.rfind("\n") + 1 :], self.receiver)

    @property
    def allowed(self) -> bool:
        """Whether the analysis allows the expected name (else the monitor must miss)."""
        return self.expected in self.names.members.get(self.receiver, ())


@dataclass(slots=True)
class Tally:
    n: int = 0
    exact: int = 0
    exists: int = 0
    invented: int = 0
    invented_open: int = 0
    empty: int = 0
    tokens: int = 0
    decode_ms: float = 0.0
    monitor_picks: int = 0
    monitor_ms: float = 0.0
    fired: int = 0
    examples: list[str] = field(default_factory=list)


def stdlib_files(packages: tuple[str, ...]) -> Iterator[tuple[Path, str]]:
    """(file, dotted module) of every module of ``packages`` in this Python's library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for package in packages:
        base = root / package
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            if parts[-1] == "__main__":  # importing it runs the package (unittest's exits)
                continue
            if "test" in parts or "tests" in parts or not all(p.isidentifier() for p in parts):
                continue
            yield path, ".".join(parts)


def truth(module: str, tree: ast.Module, line: int, receiver: str) -> frozenset[str] | None:
    """What Python says ``receiver`` has at ``line`` of ``module`` (imported here)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod = importlib.import_module(module)
    except Exception:
        return None
    head, *rest = receiver.split(".")
    method = enclosing_method(tree, line)
    if method is not None and head == method[1]:
        cls = getattr(mod, method[0].name, None)
        if not isinstance(cls, type) or rest:
            return None
        return frozenset(dir(cls)) | _assigned_on_self(cls)
    obj: object = mod.__dict__.get(head)
    if obj is None:
        return None
    for part in rest:
        if not hasattr(obj, part):
            return None
        obj = getattr(obj, part)
    return frozenset(dir(obj)) | (_assigned_on_self(obj) if isinstance(obj, type) else frozenset())


def _assigned_on_self(cls: type) -> frozenset[str]:
    """What instances get beyond ``dir(cls)``: attributes the MRO's methods assign on a
    name (``self.x = ...``) and those the classes only annotate (``value: str``, set in
    ``__init__`` by any means, e.g. ``vars(self).update(...)``)."""
    out: set[str] = set()
    for klass in cls.__mro__:
        out.update(inspect.get_annotations(klass))
        try:
            source = inspect.getsource(klass)
            node = ast.parse(inspect.cleandoc("\n" + source) if source[0].isspace() else source)
        except (OSError, TypeError, SyntaxError):
            continue
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Attribute)
                and isinstance(sub.ctx, ast.Store)
                and isinstance(sub.value, ast.Name)
            ):
                out.add(sub.attr)
    return frozenset(out)


def find_holes(options: Options) -> tuple[list[Hole], dict[str, int]]:
    """Holes at closed-set dereferences, at most two per file, spread over files in a
    seeded order; and counts of the dereferences seen (closed, open, no truth)."""
    receivers = Receivers(Resolver())
    rng = random.Random(options.seed)
    files = list(stdlib_files(options.packages))
    rng.shuffle(files)
    holes: list[Hole] = []
    seen = {"dereferences": 0, "closed": 0, "openOrUnknown": 0, "noTruth": 0}
    for path, module in files:
        if len(holes) >= options.holes:
            break
        text = path.read_text(encoding="utf-8", errors="replace")
        candidates = []
        offset = 0
        for number, line in enumerate(text.splitlines(keepends=True), 1):
            if not line.lstrip().startswith(("import", "from")):
                found = _DEREF.finditer(line)
                candidates += [(number, offset, line, m) for m in found if in_code(line, m.start())]
            offset += len(line)
        rng.shuffle(candidates)
        taken = 0
        for number, start, line, m in candidates[:12]:
            if taken >= 2 or len(holes) >= options.holes:
                break
            seen["dereferences"] += 1
            cursor = start + m.start(2)
            end = start + len(line.rstrip("\n"))
            before, after = text[:cursor], text[end:]
            line_prefix = before[before.rfind("\n") + 1 :]
            names = receivers.names(before + after, cursor, line_prefix, module)
            receiver = m.group(1)
            if names is None or receiver not in names.members:
                seen["openOrUnknown"] += 1
                continue
            tree = parse_around(before + after, cursor - len(line_prefix), cursor)
            known = None if tree is None else truth(module, tree, number, receiver)
            if known is None:
                seen["noTruth"] += 1
                continue
            seen["closed"] += 1
            holes.append(
                Hole(str(path), module, number, receiver, m.group(2), before, after, names, known)
            )
            taken += 1
    return holes, seen


def _window(backend: LlamaBackend, text: str, budget: int, *, tail: bool) -> str:
    """The last (``tail``) or first ``budget`` tokens' worth of whole lines of ``text``."""
    lines = text.splitlines(keepends=True)
    cursor_line = lines.pop() if tail and lines and not text.endswith("\n") else ""
    kept: list[str] = []
    used = backend.count_tokens(cursor_line)
    for line in reversed(lines) if tail else lines:
        used += backend.count_tokens(line)
        if used > budget:
            break
        kept.append(line)
    return "".join(reversed(kept)) + cursor_line if tail else "".join(kept)


async def run(options: Options) -> dict[str, object]:
    holes, seen = find_holes(options)
    path = models.resolve(options.model, auto_install=False)
    backend = await LlamaBackend.load(path, n_ctx=2048, n_threads=options.threads or None)
    template = TEMPLATES["qwen2.5-coder"]
    tallies: dict[str, Tally] = {}
    rows = []
    try:
        for hole in holes:
            for window in options.windows:
                before_tokens, after_tokens = WINDOWS[window]
                prefix = _window(backend, hole.before, before_tokens, tail=True)
                suffix = _window(backend, hole.after, after_tokens, tail=False)
                prompt = render(template, prefix, suffix, path=Path(hole.file).name)
                for condition, names in (
                    ("free", None),
                    ("mask", dataclasses.replace(hole.names, unmade={})),
                    ("monitor", hole.names),
                ):
                    request = GenerationRequest(
                        prompt, options.max_tokens, speculation=SpeculationMethod.NONE, names=names
                    )
                    generation = await backend.generate(request)
                    out = "".join([chunk.text async for chunk in generation])
                    stats = await generation.wait()
                    found = _IDENT.match(out)
                    name = found.group(0) if found else ""
                    key = f"{window} {condition}"
                    t = tallies.setdefault(key, Tally())
                    t.n += 1
                    t.exact += name == hole.expected
                    t.exists += bool(name) and name in hole.truth
                    invented = bool(name) and name not in hole.truth
                    t.invented += invented
                    t.invented_open += invented and hole.open_site
                    t.empty += not name
                    if invented and len(t.examples) < 6:
                        t.examples.append(f"{hole.receiver}.{name} (file: {hole.expected})")
                    n = stats.completion_tokens
                    if n > 1:
                        t.tokens += n - 1
                        t.decode_ms += stats.total_ms - stats.ttft_ms
                    t.monitor_picks += stats.monitor_picks
                    t.monitor_ms += stats.monitor_ms
                    t.fired += stats.monitor_fired
                    print(  # as it goes: a run cut short still says something
                        f"{hole.module}:{hole.line} {hole.receiver}.{hole.expected} {key}: "
                        f"{name or '-'}{' INVENTED' if invented else ''}",
                        file=sys.stderr,
                        flush=True,
                    )
                    rows.append(
                        {
                            "file": hole.file,
                            "line": hole.line,
                            "receiver": hole.receiver,
                            "expected": hole.expected,
                            "window": window,
                            "condition": condition,
                            "wrote": name,
                            "allowedByAnalysis": hole.allowed,
                            "openSite": hole.open_site,
                            "monitorPicks": stats.monitor_picks,
                            "monitorMs": round(stats.monitor_ms, 2),
                        }
                    )
    finally:
        await backend.aclose()
    return {
        "model": path.name,
        "holes": len(holes),
        "receivers": {
            "self": sum(h.receiver in ("self", "cls") for h in holes),
            "other": sum(h.receiver not in ("self", "cls") for h in holes),
        },
        "expectedOutsideAnalysis": sum(not h.allowed for h in holes),
        "openSites": sum(h.open_site for h in holes),
        "seen": seen,
        "tallies": {k: asdict(v) for k, v in tallies.items()},
        "rows": rows,
    }


def table(result: dict[str, object]) -> str:
    tallies = result["tallies"]
    assert isinstance(tallies, dict)
    lines = [
        f"model {result['model']}, {result['holes']} holes {result['receivers']}, expected name "
        f"outside the analysis' set in {result['expectedOutsideAnalysis']}, open sites "
        f"{result.get('openSites', 0)}; "
        f"dereferences seen {result['seen']}",
        f"{'condition':<15} {'exact':>7} {'exists':>7} {'invented':>9} {'open':>5} {'empty':>6} "
        f"{'ms/token':>9} {'mask ms/pick':>13} {'fired':>6}",
    ]
    for key, t in tallies.items():
        per_token = t["decode_ms"] / t["tokens"] if t["tokens"] else 0.0
        per_pick = t["monitor_ms"] / t["monitor_picks"] if t["monitor_picks"] else 0.0
        lines.append(
            f"{key:<15} {t['exact']:>4}/{t['n']:<2} {t['exists']:>4}/{t['n']:<2} "
            f"{t['invented']:>6}/{t['n']:<2} {t['invented_open']:>5} {t['empty']:>6} "
            f"{per_token:>9.1f} {per_pick:>13.2f} {t['fired']:>6}"
        )
        if t["examples"]:
            lines.append(f"{'':<15} invented: {', '.join(t['examples'])}")
    return "\n".join(lines)


def main(options: Options) -> int:
    start = time.perf_counter()
    result = asyncio.run(run(options))
    result["seconds"] = round(time.perf_counter() - start, 1)
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "names.json").write_text(json.dumps(result, indent=1))
    print(table(result))
    print(f"({result['seconds']} s; rows in {options.out / 'names.json'})", file=sys.stderr)
    return 0
