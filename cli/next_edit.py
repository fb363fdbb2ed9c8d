"""``kode next-edit FILE --line L --character C --history DIFF``: the next edit, for scripts.

``DIFF`` is a unified diff (``git diff``'s output, ``-`` for standard input) of the edits
just made, ending at ``FILE``'s text: it is undone to find the text before them, and that
change goes through the engine as an editor's ``didChange`` would (``nextEdits`` on), so
the answer is the language server's ``kode/inlineEdit`` answer (docs/protocol.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from pathlib import Path
from typing import Any

from kode.backends.errors import KodeError
from kode.cli.source import read_source
from kode.completion.documents import Position, file_name
from kode.completion.engine import CompletionEngine
from kode.completion.settings import parse

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def undo_diff(diff: str, text: str, name: str) -> str:
    """The text ``diff`` was made from, given ``text``, what it made; for a diff of several
    files, the part whose new path ends with ``name``.

    >>> diff = "--- a/x.py\\n+++ b/x.py\\n@@ -1,2 +1,2 @@\\n-a = n\\n+a = count\\n b = n\\n"
    >>> undo_diff(diff, "a = count\\nb = n\\n", "x.py")
    'a = n\\nb = n\\n'
    """
    lines = text.splitlines(keepends=True)
    hunks = _hunks_of(diff, name)
    if not hunks:
        raise KodeError(f"the history has no change to {name}")
    for new_start, old, new in reversed(hunks):  # bottom first: line numbers hold above
        at = max(new_start - 1, 0) if new else new_start
        found = [line.rstrip("\r\n") for line in lines[at : at + len(new)]]
        if found != [line.rstrip("\r\n") for line in new]:
            raise KodeError(
                f"the history does not end at {name}'s text (its hunk at line {new_start} "
                "differs): give the diff of the edits that made the file as it is now"
            )
        lines[at : at + len(new)] = [line if line.endswith("\n") else line + "\n" for line in old]
    return "".join(lines)


def _hunks_of(diff: str, name: str) -> list[tuple[int, list[str], list[str]]]:
    """(new start line, old lines, new lines) of each hunk of the file ``name``."""
    files: list[tuple[str, list[tuple[int, list[str], list[str]]]]] = []
    current: list[tuple[int, list[str], list[str]]] | None = None
    for line in diff.splitlines(keepends=True):
        if line.startswith("+++ "):
            path = line[4:].strip().split("\t")[0]
            current = []
            files.append((path, current))
        elif (match := _HUNK.match(line)) and current is not None:
            current.append((int(match.group(3)), [], []))
        elif current and line[:1] in (" ", "-", "+") and not line.startswith("--- "):
            _, old, new = current[-1]
            body = line[1:]
            if line[0] in (" ", "-"):
                old.append(body)
            if line[0] in (" ", "+"):
                new.append(body)
    if len(files) == 1:
        return files[0][1]
    matching = [hunks for path, hunks in files if path.endswith(name)]
    if len(matching) != 1:
        raise KodeError(f"the history names {len(matching)} files ending in {name}, not one")
    return matching[0]


async def next_edit(text: str, before: str, uri: str, line: int, character: int) -> dict[str, Any]:
    """The ``kode/inlineEdit`` answer for ``uri`` (now ``text``, just edited from
    ``before``) at ``line``:``character``."""

    async def no_backend(_settings: object) -> Any:
        raise KodeError("next edits from the history need no model")

    settings, problems = parse({"nextEdits": True, "readAhead": False, "prefetch": False})
    assert not problems
    engine = CompletionEngine(no_backend, settings)
    try:
        engine.documents.open(uri, before, 1, "python" if uri.endswith(".py") else "plaintext")
        engine.apply_changes(uri, 2, [(text, None)])
        edit = await engine.next_edit(uri, Position(line, character))
    finally:
        await engine.aclose()
    if edit is None:
        return {"edits": []}
    start, end = edit.range.start, edit.range.end
    return {
        "edits": [
            {
                "textDocument": {"uri": edit.uri, "version": edit.version},
                "range": {
                    "start": {"line": start.line, "character": start.character},
                    "end": {"line": end.line, "character": end.character},
                },
                "text": edit.text,
                "kind": edit.kind.value,
            }
        ]
    }


def _run(args: argparse.Namespace) -> int:
    text, uri = read_source(args.file)
    diff = sys.stdin.read() if str(args.history) == "-" else _read(args.history)
    before = undo_diff(diff, text, args.file.name)
    answer = asyncio.run(next_edit(text, before, uri, args.line, args.character))
    if args.json:
        print(json.dumps(answer))
        return 0
    if not answer["edits"]:
        print(f"kode: no next edit in {file_name(uri)} from this history", file=sys.stderr)
        return 0
    [edit] = answer["edits"]
    start, end = edit["range"]["start"], edit["range"]["end"]
    where = f"{start['line']}:{start['character']}-{end['line']}:{end['character']}"
    print(f"{where} {edit['kind']}: {edit['text']!r}")
    return 0


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KodeError(f"cannot read the history {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise KodeError(f"the history {path} is not UTF-8") from None


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "next-edit", help="the next edit after the edits in a diff (kode/inlineEdit)"
    )
    parser.add_argument("file", type=Path)
    parser.add_argument("--line", type=int, required=True, help="0-based")
    parser.add_argument("--character", type=int, required=True, help="0-based, UTF-16")
    parser.add_argument(
        "--history",
        type=Path,
        required=True,
        help="a unified diff (git diff) of the edits just made, ending at FILE; - for stdin",
    )
    parser.add_argument("--json", action="store_true", help="kode/inlineEdit's result")
    parser.set_defaults(func=_run)
