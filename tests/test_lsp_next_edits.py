"""Next edits through the language server (issue #49): ``kode/inlineEdit`` and the
standard inline completion with a ``range``. The server runs in this event loop behind
its real reading loop (``lsp_wire.Wire``) with a scripted backend; no model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes.completion import FailingBackend
from lsp_process import StdioWindow
from lsp_wire import Wire, did_open, inline, notification, request

ON = {"readAhead": False, "prefetch": False, "nextEdits": True}
URI = "file:///project/pkg/shapes.py"
TEXT = "def scale(n, k):\n    total = n * k\n    return total + n\n"


def rename_at_first_use(version: int = 2) -> dict[str, Any]:
    """``n`` -> ``count`` in the parameter list, typed as one change."""
    return notification(
        "textDocument/didChange",
        {
            "textDocument": {"uri": URI, "version": version},
            "contentChanges": [
                {
                    "range": {
                        "start": {"line": 0, "character": 10},
                        "end": {"line": 0, "character": 11},
                    },
                    "text": "count",
                }
            ],
        },
    )


def inline_edit(n: int, line: int, character: int, version: int | None = 2) -> dict[str, Any]:
    document: dict[str, Any] = {"uri": URI}
    if version is not None:
        document["version"] = version
    position = {"line": line, "character": character}
    return request(n, "kode/inlineEdit", {"textDocument": document, "position": position})


def edits(reply: dict[str, Any]) -> list[dict[str, Any]]:
    assert "result" in reply, reply
    found: list[dict[str, Any]] = reply["result"]["edits"]
    return found


async def test_a_rename_is_proposed_at_the_next_use() -> None:
    async with Wire(FailingBackend()) as wire:
        await wire.initialize(ON)
        wire.send(did_open(URI, TEXT), rename_at_first_use(), inline_edit(1, 0, 15))
        [edit] = edits(await wire.response(1))
        assert edit == {
            "textDocument": {"uri": URI, "version": 2},
            "range": {"start": {"line": 1, "character": 12}, "end": {"line": 1, "character": 13}},
            "text": "count",
        }


async def test_nothing_for_a_version_the_editor_left_or_with_next_edits_off() -> None:
    async with Wire(FailingBackend()) as wire:
        await wire.initialize(ON)
        wire.send(did_open(URI, TEXT), rename_at_first_use(), inline_edit(1, 0, 15, version=1))
        assert edits(await wire.response(1)) == []
        wire.send(inline_edit(2, 0, 15, version=None))  # no version: the current one
        assert len(edits(await wire.response(2))) == 1
        off = {**ON, "nextEdits": False}
        wire.send(notification("workspace/didChangeConfiguration", {"settings": off}))
        wire.send(inline_edit(3, 0, 15))
        assert edits(await wire.response(3)) == []


async def test_nothing_when_no_edit_repeats() -> None:
    async with Wire(FailingBackend()) as wire:
        await wire.initialize(ON)
        wire.send(did_open(URI, TEXT), inline_edit(1, 0, 0, version=1))
        assert edits(await wire.response(1)) == []


async def test_bad_params_and_unknown_documents_are_told() -> None:
    async with Wire(FailingBackend()) as wire:
        await wire.initialize(ON)
        wire.send(request(1, "kode/inlineEdit", {"position": {"line": 0}}))
        assert (await wire.response(1))["error"]["code"] == -32602
        wire.send(inline_edit(2, 0, 0))
        reply = await wire.response(2)
        assert reply["error"]["code"] == -32602
        assert "not open" in reply["error"]["message"]


async def test_an_edit_on_the_cursors_line_answers_an_empty_inline_completion() -> None:
    """The model had nothing at the cursor: the next edit on its line shows instead."""
    text = "def scale(n, k):\n    return n * k + n\n"
    async with Wire(FailingBackend(chunks=())) as wire:
        await wire.initialize(ON)
        change = {
            "textDocument": {"uri": URI, "version": 2},
            "contentChanges": [
                {
                    "range": {
                        "start": {"line": 1, "character": 11},
                        "end": {"line": 1, "character": 12},
                    },
                    "text": "count",
                }
            ],
        }
        # The use after `return ` renamed; the next use is on the same line.
        wire.send(did_open(URI, text), notification("textDocument/didChange", change))
        wire.send(inline(1, URI, 1, 16))
        reply = await wire.response(1)
        [item] = reply["result"]["items"]
        assert item["insertText"] == "count"
        assert item["range"]["start"]["line"] == item["range"]["end"]["line"] == 1


@pytest.mark.model
def test_the_real_server_proposes_the_rename_and_a_keystroke_cancels_the_request(
    tmp_path: Path,
) -> None:
    """``kode lsp`` itself (the 0.5B model loaded for completions): a rename at one use,
    ``kode/inlineEdit`` at the next proposes it; a request cancelled by a keystroke
    answers -32800 or an edit for the version it asked about, and nothing is left
    running: the next request answers for the new text, and the process ends cleanly."""
    options = {**ON, "model": "small", "maxTokens": 8, "firstAnswerMs": 0}
    with StdioWindow(tmp_path / "window.log") as window:
        window.initialize(None, options, 240)
        window.open(URI, TEXT)
        window.together(rename_at_first_use())
        [edit] = edits(window.answer(window.ask(*ask(0, 15, 2)), 60))
        assert edit["text"] == "count"
        assert edit["range"]["start"] == {"line": 1, "character": 12}
        n = window.next_id()
        typed = notification(
            "textDocument/didChange",
            {
                "textDocument": {"uri": URI, "version": 3},
                "contentChanges": [
                    {
                        "range": {
                            "start": {"line": 1, "character": 12},
                            "end": {"line": 1, "character": 13},
                        },
                        "text": "count",
                    }
                ],
            },
        )
        window.together(
            inline_edit(n, 0, 15),
            notification("$/cancelRequest", {"id": n}),
            typed,  # the user applied it by hand
        )
        reply = window.answer(n, 60)
        if "error" in reply:
            assert reply["error"]["code"] == -32800, reply
        else:
            assert all(e["textDocument"]["version"] == 2 for e in edits(reply))
        # The renamed name's last use is next, in the text as it is now.
        [last] = edits(window.answer(window.ask(*ask(1, 16, 3)), 60))
        assert last["range"]["start"] == {"line": 2, "character": 19}
        assert last["textDocument"]["version"] == 3
        window.end(30)
        assert window.proc.returncode == 0


def ask(line: int, character: int, version: int) -> tuple[str, dict[str, Any]]:
    position = {"line": line, "character": character}
    document = {"uri": URI, "version": version}
    return "kode/inlineEdit", {"textDocument": document, "position": position}
