"""The tasks the benchmarks complete, and seeded sampling: pure (no model, no network),
unit-tested in ``tests/test_bench_tasks.py``.

Tasks come from two places:

- HumanEval infilling (``HumanEval-{Single,Multi}LineInfilling.jsonl.gz``): a seeded sample
  of rows. The hole is a whole line (or lines): ``prompt`` ends with a line break and the
  canonical solution ends with one, so in an editor the hole is an empty line between
  ``prompt`` and ``suffix``.
- Random-span infilling (``random_span``): a multi-line task's canonical solution cut at
  two seeded random characters; the hole is what lies between, so it starts and ends
  mid-line, as in the SantaCoder/StarCoder FIM evaluations. Judged by the same tests.
- Real-file mid-line holes (``file_span_tasks``): large files of the standard library cut
  at a random character inside a line, the hole running to a random character up to
  three lines on. No tests exist for these: the fill passes when it restores the file.
- "Edit-like" tasks cut from real source files: a line that shares a long run of words
  with an earlier line (``self.width * self.height`` after ``self.radius**2`` ...), the
  file cut at the start of that line. These are the completions where copying from the
  context (n-gram drafting) should pay.
"""

from __future__ import annotations

import enum
import gzip
import json
import os
import random
import re
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

REPO_ROOT = Path(__file__).resolve().parent.parent
HUMANEVAL_FILES = {
    "single": "HumanEval-SingleLineInfilling.jsonl.gz",
    "multi": "HumanEval-MultiLineInfilling.jsonl.gz",
}
# The random-span set is cut from the multi-line set's tasks.
SPAN_SOURCE = "multi"
# The repository's own sources used for edit-like tasks (examples/ first: it is stable).
SOURCE_DIRS = ("examples", "backends", "completion", "lsp", "cli")
T = TypeVar("T")


# -- tasks ------------------------------------------------------------------------------


class Judge(enum.Enum):
    """How a fill is judged."""

    TESTS = "tests"  # run the task's tests in the sandbox
    EXACT = "exact"  # the filled text equals the original (line-end whitespace aside)


@dataclass(frozen=True, slots=True)
class HumanEvalTask:
    """One infilling problem: ``prompt`` + hole + ``suffix``, checked by ``test``.

    ``separator`` is what the editor holds between ``prompt`` and ``suffix`` besides the
    fill: a line break for the line-based HumanEval sets (the hole is an empty line),
    nothing for a span cut mid-line.
    """

    task_id: str
    prompt: str
    suffix: str
    canonical_solution: str
    test: str
    entry_point: str
    separator: str = "\n"
    judge: Judge = Judge.TESTS

    def document(self) -> str:
        """The text the editor holds, the cursor at ``len(prompt)``."""
        return self.prompt + self.separator + self.suffix

    def program(self, completion: str) -> str:
        """The program to run when ``completion`` fills the hole."""
        return (
            f"{self.prompt}{completion}{self.separator}{self.suffix}\n{self.test}\n"
            f"check({self.entry_point})\n"
        )

    def restores(self, completion: str) -> bool:
        """Whether ``completion`` gives back the original text (judge ``EXACT``);
        whitespace at line ends does not count."""
        return _line_ends_stripped(self.prompt + completion + self.suffix) == _line_ends_stripped(
            self.prompt + self.canonical_solution + self.suffix
        )


def _line_ends_stripped(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.split("\n"))


def random_span(task: HumanEvalTask, seed: int) -> HumanEvalTask:
    """``task``'s canonical solution cut at two random characters (seeded by ``seed`` and
    the task id, so independent of sampling order); the hole is what lies between and
    holds more than whitespace. The suffix is joined without a separator.

    Example: solution ``"    y = x + 1\n"`` may give prompt ``... "    y = x"``, hole
    ``" + 1\n  "`` and suffix ``"  return y"``.
    """
    body = task.canonical_solution
    if body.endswith("\n") and task.suffix.startswith("\n"):
        body = body[:-1]  # the set's suffix brings this line break back
    rng = random.Random(f"{seed}:{task.task_id}")
    if not body.strip():
        raise ValueError(f"{task.task_id}: empty canonical solution")
    while True:
        i, j = sorted(rng.sample(range(len(body) + 1), 2))
        if body[i:j].strip():
            break
    return HumanEvalTask(
        task_id=f"{task.task_id}/S{i}_{j}",
        prompt=task.prompt + body[:i],
        suffix=body[j:] + task.suffix,
        canonical_solution=body[i:j],
        test=task.test,
        entry_point=task.entry_point,
        separator="",
    )


def file_span_tasks(
    files: Sequence[Path],
    n: int,
    seed: int,
    *,
    before_lines: int = 40,
    after_lines: int = 20,
    max_span_lines: int = 3,
    line_start: bool = False,
) -> list[HumanEvalTask]:
    """``n`` holes cut from real files, round-robin over ``files``: each starts at a
    random character inside a line with code on both sides of it (a mid-line cursor)
    and ends at a random character of that line or of one of the next
    ``max_span_lines`` lines. With ``line_start``, each starts after a line's
    indentation instead (nothing after the cursor on its line: the editor's most common
    cursor, where multi-line fills are allowed) and ends at the end of that line or of
    one of the next ``max_span_lines`` lines. The document keeps ``before_lines`` lines
    before the cursor line and ``after_lines`` after the hole's last line (prefill is
    slow here). Judged ``EXACT``."""
    rng = random.Random(seed)
    texts: list[tuple[str, list[str]]] = []
    for path in files:
        try:
            lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        except (OSError, UnicodeDecodeError):
            continue
        texts.append((path.name, lines))
    out: list[HumanEvalTask] = []
    attempts = 0
    while texts and len(out) < n and attempts < 100 * n:
        attempts += 1
        name, lines = texts[len(out) % len(texts)]
        row = rng.randrange(before_lines, max(before_lines + 1, len(lines) - after_lines - 4))
        line = lines[row].rstrip("\r\n") if row < len(lines) else ""
        body = line.strip()
        if len(body) < 12 or body.startswith(("#", '"', "'")):
            continue
        indent = len(line) - len(line.lstrip())
        start = indent if line_start else rng.randrange(indent + 1, len(line))
        if not line[start:].strip():
            continue
        last = min(len(lines) - 1, row + rng.randrange(max_span_lines + 1))
        begin = sum(len(x) for x in lines[:row]) + start
        end_line = lines[last].rstrip("\r\n")
        text = "".join(lines)
        last_begins = sum(len(x) for x in lines[:last])
        if line_start:
            end = last_begins + len(end_line)
        else:
            low = start + 1 if last == row else 0
            if low > len(end_line):
                continue
            end = last_begins + rng.randrange(low, len(end_line) + 1)
        hole = text[begin:end]
        if not hole.strip() or "\r" in hole:
            continue
        head = sum(len(x) for x in lines[: row - before_lines])
        tail = sum(len(x) for x in lines[: last + 1 + after_lines])
        out.append(
            HumanEvalTask(
                task_id=f"{name}:{row + 1}:{start}",
                prompt=text[head:begin],
                suffix=text[end:tail],
                canonical_solution=hole,
                test="",
                entry_point="",
                separator="",
                judge=Judge.EXACT,
            )
        )
    return out


def stdlib_files(count: int = 12) -> list[Path]:
    """The ``count`` largest modules of this Python's standard library (tests and
    vendored packages aside), largest first: stable for one Python version."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found = [p for p in root.glob("*.py") if p.is_file() and not p.name.startswith(("_", "test"))]
    found.sort(key=lambda p: (-p.stat().st_size, p.name))
    return found[:count]


@dataclass(frozen=True, slots=True)
class EditTask:
    """A line of a real file to complete, whose pattern appears earlier in the file.

    ``prefix`` ends at the start of the line, ``middle`` is the line (without its line
    break), ``suffix`` starts with that line break.
    """

    task_id: str
    prefix: str
    middle: str
    suffix: str
    shared: str  # the longest run of words the line shares with an earlier line


def data_dir(environ: dict[str, str] | None = None) -> Path:
    """Where the HumanEval infilling files are: ``$KODE_HUMANEVAL_DIR``, else
    ``shared/data/humaneval-infilling`` in or beside the checkout, else the copy in
    ``bench/data``."""
    env = os.environ if environ is None else environ
    named = env.get("KODE_HUMANEVAL_DIR")
    if named:
        return Path(named)
    tail = Path("shared") / "data" / "humaneval-infilling"
    for base in (REPO_ROOT, REPO_ROOT.parent):
        if (base / tail).is_dir():
            return base / tail
    # A copy ships with Kode (MIT licence, see its LICENSE file).
    return Path(__file__).parent / "data" / "humaneval-infilling"


def humaneval_path(which: str, folder: Path | None = None) -> Path:
    return (folder or data_dir()) / HUMANEVAL_FILES[which]


def load_humaneval(path: Path) -> list[HumanEvalTask]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle if line.strip()]
    return [
        HumanEvalTask(
            task_id=r["task_id"],
            prompt=r["prompt"],
            suffix=r["suffix"],
            canonical_solution=r["canonical_solution"],
            test=r["test"],
            entry_point=r["entry_point"],
        )
        for r in rows
    ]


def sample(items: Sequence[T], n: int | None, seed: int) -> list[T]:
    """A seeded sample of ``n`` items (all of them, in order, when ``n`` is None or too
    large). The same seed and items always give the same sample, in the same order."""
    if n is None or n >= len(items):
        return list(items)
    picked = random.Random(seed).sample(range(len(items)), n)
    return [items[i] for i in picked]


_WORD = re.compile(r"\w+|[^\w\s]")


def words(line: str) -> list[str]:
    """Identifier/number runs and single punctuation marks: ``words("a.b(1)")`` ==
    ``["a", ".", "b", "(", "1", ")"]``."""
    return _WORD.findall(line)


def longest_shared_run(line: Sequence[str], earlier: Sequence[str]) -> list[str]:
    """The longest run of consecutive words found in both sequences (the first one found
    when several are as long).

    Example: ``longest_shared_run(["x", "=", "a", ".", "b"], ["y", "=", "a", ".", "b"])``
    is ``["=", "a", ".", "b"]``.
    """
    best, end = 0, 0
    prev = [0] * (len(earlier) + 1)
    for i, a in enumerate(line):
        cur = [0] * (len(earlier) + 1)
        for j, b in enumerate(earlier, start=1):
            if a == b:
                cur[j] = prev[j - 1] + 1
                if cur[j] > best:
                    best, end = cur[j], i + 1
        prev = cur
    return list(line[end - best : end])


def identifier_chars(run: Sequence[str]) -> int:
    """Characters of the identifiers and numbers in a run of words (punctuation is cheap
    to share, so it does not count): ``identifier_chars(["self", ".", "x"]) == 5``."""
    return sum(len(w) for w in run if w[0].isalnum() or w[0] == "_")


def edit_candidates(
    text: str,
    *,
    name: str,
    min_shared: int = 5,
    min_identifier_chars: int = 12,
    min_chars: int = 12,
    window: int = 40,
    suffix_lines: int = 20,
) -> list[EditTask]:
    """Every line of ``text`` that shares a run of at least ``min_shared`` consecutive
    words, holding at least ``min_identifier_chars`` characters of identifiers, with one
    of the ``window`` lines before it, as an edit-like task.

    The prompt keeps ``window`` lines before the line and ``suffix_lines`` after it, so
    the earlier occurrence is always inside the prompt and prompts stay short (prefill
    is slow on a small CPU). Example: in ``examples/shapes.py`` the second
    ``def area(self) -> float:`` shares all eight of its words with the first one, so
    it is a candidate; ``return math.pi * self.radius**2`` shares nothing long.
    """
    lines = text.splitlines(keepends=True)
    tokens = [words(line) for line in lines]
    out: list[EditTask] = []
    for i, line in enumerate(lines):
        body = line.strip()
        if len(body) < min_chars or body.startswith("#"):
            continue
        lo = max(0, i - window)
        best: list[str] = []
        for j in range(lo, i):
            run = longest_shared_run(tokens[i], tokens[j])
            if identifier_chars(run) > identifier_chars(best):
                best = run
        if len(best) < min_shared or identifier_chars(best) < min_identifier_chars:
            continue
        indent = line[: len(line) - len(line.lstrip())]
        middle = line.rstrip("\r\n")[len(indent) :]
        after = "".join(lines[i + 1 : i + 1 + suffix_lines])
        ending = line[len(line.rstrip("\r\n")) :]
        out.append(
            EditTask(
                task_id=f"{name}:{i + 1}",
                prefix="".join(lines[lo:i]) + indent,
                middle=middle,
                suffix=ending + after,
                shared=" ".join(best),
            )
        )
    return out


def source_files(root: Path = REPO_ROOT, dirs: Sequence[str] = SOURCE_DIRS) -> list[Path]:
    """Python files under ``dirs`` of ``root``, in a stable order."""
    files: list[Path] = []
    for d in dirs:
        folder = root / d
        if folder.is_dir():
            files.extend(sorted(p for p in folder.rglob("*.py") if "__pycache__" not in p.parts))
    return files


def edit_tasks(
    files: Sequence[Path], n: int | None, seed: int, root: Path = REPO_ROOT
) -> list[EditTask]:
    """A seeded sample of edit-like tasks, spread over the files (round-robin over the
    files in order, each file's candidates shuffled by the seed)."""
    rng = random.Random(seed)
    per_file: list[list[EditTask]] = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        name = str(path.relative_to(root)) if path.is_relative_to(root) else path.name
        found = edit_candidates(text, name=name)
        rng.shuffle(found)
        if found:
            per_file.append(found)
    out: list[EditTask] = []
    depth = 0
    while per_file and (n is None or len(out) < n):
        added = False
        for found in per_file:
            if depth < len(found):
                out.append(found[depth])
                added = True
                if n is not None and len(out) >= n:
                    break
        if not added:
            break
        depth += 1
    return out
