"""The cases of ``kode bench next-edit``: edit sequences cut from real git history.

A commit's change to one file is a sequence of hunks (``git diff -U0``: each run of
changed lines is one hunk), ordered top to bottom. Case ``k`` of that sequence applies
the first ``k`` hunks and asks for the next edit; the answer is judged against hunk
``k + 1`` (``bench/next_edits.py`` replays and scores it). This module reads git and
cuts; everything but ``GitReader`` is pure (the unit tests use it on synthetic diffs).

Which hunks and files are kept ("modest size"):

- text files whose name ends in one of ``EXTENSIONS``, at most ``MAX_FILE_CHARS``
  characters, UTF-8, ``\\n`` line ends only, that exist before and after the commit;
- two hunks or more; the first ``max_hunks`` form the sequence;
- a case whose next hunk has more than ``MAX_HUNK_LINES`` lines on either side is left
  out (a rewrite of a block is no edit a person repeats or a predictor should guess); the
  hunk is still applied for the cases after it.

Classes, decided from the diff alone (nothing of Kode's repeat finder is used):

- A hunk's **token changes**: its old and new lines as tokens (``tokenize``: names,
  numbers, one-line string literals, any other non-space character; white space is not
  a token), aligned with ``difflib.SequenceMatcher``; each run that is not equal is one
  change, ``(old tokens, new tokens)``. ``n`` -> ``count`` twice on a line is the change
  ``(("n",), ("count",))`` twice; ``f(a)`` -> ``f(a, t)`` is ``((), (",", "t"))``.
- **repeat**: the next hunk has at least one token change, and every one of its token
  changes is a token change of an earlier hunk of the sequence (a rename continued,
  the same argument added, the same call replaced).
- **other**: everything else (white space only included).
"""

from __future__ import annotations

import difflib
import re
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

EXTENSIONS = (
    ".py", ".pyi", ".pyx", ".rst", ".md", ".txt", ".toml", ".cfg", ".ini", ".yml", ".yaml",
    ".json", ".js", ".ts", ".html", ".css", ".c", ".h", ".sh",
)  # fmt: skip
MAX_FILE_CHARS = 200_000
MAX_HUNK_LINES = 20
REPEAT, OTHER = "repeat", "other"
CLASSES = (REPEAT, OTHER)

TokenChange = tuple[tuple[str, ...], tuple[str, ...]]

_TOKEN = re.compile(
    r"""\"(?:\\.|[^"\\\n])*\"|'(?:\\.|[^'\\\n])*'|[^\W\d]\w*|\d[\w.]*|\S""",
)
_HEADER = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def tokenize(text: str) -> list[str]:
    """The tokens of ``text`` (module docstring).

    >>> tokenize("f(a, 'x y') + 12")
    ['f', '(', 'a', ',', "'x y'", ')', '+', '12']
    """
    return _TOKEN.findall(text)


def token_changes(old: str, new: str) -> tuple[TokenChange, ...]:
    """The token changes that turn ``old`` into ``new``, in order (module docstring).

    >>> token_changes("x = f(n) + n\\n", "x = f(count) + count\\n")
    ((('n',), ('count',)), (('n',), ('count',)))
    >>> token_changes("f(a)\\n", "f(a, t)\\n")
    (((), (',', 't')),)
    >>> token_changes("a  =  1", "a = 1")
    ()
    """
    a, b = tokenize(old), tokenize(new)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return tuple(
        (tuple(a[i1:i2]), tuple(b[j1:j2]))
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    )


@dataclass(frozen=True, slots=True)
class Hunk:
    """Lines ``old`` (each with its line break) starting at 0-based line ``start`` of
    the file before the commit became lines ``new``. ``header``: git's numbers
    ``(old start, old count, new start, new count)``."""

    start: int
    old: tuple[str, ...]
    new: tuple[str, ...]
    header: tuple[int, int, int, int]

    @property
    def modest(self) -> bool:
        return len(self.old) <= MAX_HUNK_LINES and len(self.new) <= MAX_HUNK_LINES

    def changes(self) -> tuple[TokenChange, ...]:
        return token_changes("".join(self.old), "".join(self.new))


def parse_diff(diff: str) -> dict[str, list[tuple[int, int, int, int]]]:
    """The hunk headers of each file of a ``git diff -U0`` (``a/``, ``b/`` prefixes):
    path after the commit -> ``(old start, old count, new start, new count)``. Files
    added or deleted, and quoted (unusual) paths, are left out.

    >>> parse_diff('''diff --git a/x.py b/x.py
    ... --- a/x.py
    ... +++ b/x.py
    ... @@ -3 +3 @@ def f():
    ... -    return n
    ... +    return count
    ... @@ -7,0 +8,2 @@
    ... +a
    ... +b
    ... ''')
    {'x.py': [(3, 1, 3, 1), (7, 0, 8, 2)]}
    """
    files: dict[str, list[tuple[int, int, int, int]]] = {}
    current: list[tuple[int, int, int, int]] | None = None
    old_ok = False
    for line in diff.splitlines():
        if line.startswith("diff --git "):
            current, old_ok = None, False
        elif line.startswith("--- "):
            old_ok = line.startswith("--- a/")
        elif line.startswith("+++ "):
            current = None
            if old_ok and line.startswith("+++ b/"):
                current = files.setdefault(line[len("+++ b/") :], [])
        elif current is not None and line.startswith("@@"):
            m = _HEADER.match(line)
            if m is not None:
                a, b, c, d = m.groups()
                current.append(
                    (int(a), 1 if b is None else int(b), int(c), 1 if d is None else int(d))
                )
    return files


def cut_hunks(
    old_text: str, new_text: str, headers: Sequence[tuple[int, int, int, int]]
) -> list[Hunk]:
    """The hunks of one file, top to bottom, their lines read from the two texts (so a
    missing last line break is exact); empty if the headers do not fit the texts.

    >>> headers = [(2, 1, 2, 1), (3, 0, 4, 1)]
    >>> [h.start for h in cut_hunks("a\\nb\\nc\\n", "a\\nB\\nc\\nd\\n", headers)]
    [1, 3]
    """
    old_lines = old_text.splitlines(keepends=True)
    new_lines = new_text.splitlines(keepends=True)
    hunks: list[Hunk] = []
    for a, b, c, d in sorted(headers):
        start = a - 1 if b else a  # ``-a,0``: inserted after line a
        new_start = c - 1 if d else c
        if start < 0 or start + b > len(old_lines) or new_start + d > len(new_lines):
            return []
        old = tuple(old_lines[start : start + b])
        new = tuple(new_lines[new_start : new_start + d])
        hunks.append(Hunk(start, old, new, (a, b, c, d)))
    return hunks


def applied(old_text: str, hunks: Sequence[Hunk]) -> str:
    """``old_text`` with ``hunks`` (top to bottom, of that text) applied.

    >>> h = cut_hunks("a\\nb\\nc\\n", "a\\nB\\nc\\nd\\n", [(2, 1, 2, 1), (3, 0, 4, 1)])
    >>> applied("a\\nb\\nc\\n", h)
    'a\\nB\\nc\\nd\\n'
    """
    lines = old_text.splitlines(keepends=True)
    for hunk in reversed(hunks):
        lines[hunk.start : hunk.start + len(hunk.old)] = hunk.new
    return "".join(lines)


def classify(hunks: Sequence[Hunk], k: int) -> str:
    """``REPEAT`` if hunk ``k`` (0-based: the next one after the first ``k``) repeats the
    token changes of the hunks before it, else ``OTHER`` (module docstring)."""
    wanted = hunks[k].changes()
    if not wanted:
        return OTHER
    seen = {change for hunk in hunks[:k] for change in hunk.changes()}
    return REPEAT if all(change in seen for change in wanted) else OTHER


@dataclass(frozen=True, slots=True)
class FileSequence:
    """One file's hunks in one commit; ``cases``: the ``k`` (hunks applied before the
    request, 1-based count) of the cases kept, with each one's class."""

    repo: str
    commit: str
    path: str
    old_text: str
    hunks: tuple[Hunk, ...]
    cases: tuple[tuple[int, str], ...]


def sequence(
    repo: str,
    commit: str,
    path: str,
    old_text: str,
    new_text: str,
    headers: Sequence[tuple[int, int, int, int]],
    max_hunks: int,
) -> FileSequence | None:
    """The file's sequence and its cases (module docstring), or None if it has none."""
    if not keep_file(path, old_text) or not keep_file(path, new_text):
        return None
    hunks = cut_hunks(old_text, new_text, headers)
    if len(hunks) < 2 or applied(old_text, hunks) != new_text:
        return None
    hunks = hunks[:max_hunks]
    cases = tuple((k, classify(hunks, k)) for k in range(1, len(hunks)) if hunks[k].modest)
    if not cases:
        return None
    return FileSequence(repo, commit, path, old_text, tuple(hunks), cases)


def keep_file(path: str, text: str) -> bool:
    return (
        path.endswith(EXTENSIONS)
        and 0 < len(text) <= MAX_FILE_CHARS
        and "\r" not in text
        and "\x00" not in text
    )


class GitReader:
    """Reads one repository through ``git`` (a bare or a working directory)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = _repo_name(path)
        self._cat: subprocess.Popen[bytes] | None = None

    def commits(self, revs: str = "HEAD") -> list[str]:
        """The commits of ``revs`` that have one parent (merges and roots left out)."""
        out = self._git("rev-list", "--min-parents=1", "--max-parents=1", revs)
        return out.split()

    def head(self) -> str:
        """The commit ``HEAD`` names (the snapshot a run read)."""
        return self._git("rev-parse", "HEAD").strip()

    def diff(self, commit: str) -> str:
        return self._git(
            "diff", "-U0", "--no-color", "--no-ext-diff", "--no-renames", "--src-prefix=a/",
            "--dst-prefix=b/", f"{commit}^", commit,
        )  # fmt: skip

    def text(self, commit: str, path: str) -> str | None:
        """The file at ``commit`` (None if missing, too large or not UTF-8)."""
        cat = self._cat
        if cat is None:
            cat = self._cat = subprocess.Popen(
                ["git", f"--git-dir={self._git_dir()}", "cat-file", "--batch"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        assert cat.stdin is not None
        assert cat.stdout is not None
        cat.stdin.write(f"{commit}:{path}\n".encode())
        cat.stdin.flush()
        header = cat.stdout.readline().decode().split()
        if len(header) != 3 or header[1] != "blob":
            return None
        data = cat.stdout.read(int(header[2]) + 1)[:-1]
        if len(data) > MAX_FILE_CHARS * 4:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def sequences(self, commit: str, max_hunks: int) -> Iterator[FileSequence]:
        try:
            diff = self.diff(commit)
        except subprocess.CalledProcessError:
            return  # its parent is not in this copy (a snapshot cut below it): no case
        for path, headers in parse_diff(diff).items():
            if len(headers) < 2 or not path.endswith(EXTENSIONS):
                continue
            old = self.text(f"{commit}^", path)
            new = self.text(commit, path) if old is not None else None
            if old is None or new is None:
                continue
            found = sequence(self.name, commit, path, old, new, headers, max_hunks)
            if found is not None:
                yield found

    def close(self) -> None:
        cat, self._cat = self._cat, None
        if cat is not None:
            assert cat.stdin is not None
            assert cat.stdout is not None
            cat.stdin.close()
            cat.wait()
            cat.stdout.close()

    def _git_dir(self) -> str:
        return self._git("rev-parse", "--absolute-git-dir").strip()

    def _git(self, *args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(self.path), *args],
            check=True,
            capture_output=True,
            text=True,
            encoding="utf-8",
            errors="replace",
        ).stdout


def _repo_name(path: Path) -> str:
    """``owner/name`` for a mirror folder (``/work/.mirror/owner+name/repo``), else the
    folder's name."""
    parts = [p for p in path.resolve().parts if p not in ("repo", ".git")]
    last = parts[-1] if parts else str(path)
    return last.replace("+", "/", 1) if "+" in last else last.removesuffix(".git")
