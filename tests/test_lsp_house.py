"""Issue #51's bugs a user meets in the language server: each has its regression test here
(bugs 1, 2 and 4; bug 3 is the VS Code extension's, bug 5 the backends'). The server runs
in this event loop behind its real reading loop (``lsp_wire.Wire``) with a scripted
backend, except one test that drives the real ``kode lsp`` with the 0.5B model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fakes.completion import FailingBackend, ScriptedBackend
from fakes.timing import until
from lsp_process import StdioWindow
from lsp_wire import Wire, did_open, inline, notification, request

QUIET = {"readAhead": False, "prefetch": False}
URI = "file:///project/pkg/main.py"


def items(reply: dict[str, Any]) -> list[str]:
    assert "result" in reply, reply
    return [item["insertText"] for item in reply["result"]["items"]]


def did_close(uri: str) -> dict[str, Any]:
    return notification("textDocument/didClose", {"textDocument": {"uri": uri}})


# Bug 1: didClose was async and didOpen sync, so the close ran after the reopening.


async def test_a_close_and_open_in_one_read_leave_the_document_open() -> None:
    async with Wire(FailingBackend()) as wire:
        await wire.initialize(QUIET)
        wire.send(did_open(URI, "value = "))
        # What VS Code sends when a file's language mode changes: both in one read.
        wire.send(did_close(URI), did_open(URI, "value = ", version=2), inline(1, URI, 0, 8))
        assert items(await wire.response(1)) == [" = 1"]
        assert URI in wire.server.engine.documents


@pytest.mark.model
def test_the_real_server_completes_after_a_close_and_open_in_one_write(tmp_path: Path) -> None:
    """``kode lsp`` itself over a pipe, with the 0.5B model."""
    options = {**QUIET, "model": "small", "maxTokens": 8, "firstAnswerMs": 0}
    text = "def add(a, b):\n    return "
    with StdioWindow(tmp_path / "window.log") as window:
        window.initialize(None, options, 240)
        window.open(URI, text)
        n = window.next_id()
        window.together(
            did_close(URI),
            did_open(URI, text, version=2),
            inline(n, URI, 1, 11),
        )
        answer = window.answer(n, 240)
        assert "error" not in answer, answer
        assert answer["result"]["items"], answer  # the document is open: the model answered
        window.end(30)
        assert window.proc.returncode == 0


# Bug 2: settings turned on after start never built the workspace index.


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "helpers.py").write_text("def helper():\n    return 1\n", encoding="utf-8")
    return tmp_path.resolve()


@pytest.mark.parametrize("off", [{"enabled": False}, {"workspaceIndex": False}])
async def test_settings_turned_on_later_build_the_index(root: Path, off: dict[str, Any]) -> None:
    async with Wire(FailingBackend()) as wire:
        wire.send(
            request(
                0,
                "initialize",
                {
                    "capabilities": {},
                    "rootUri": root.as_uri(),
                    "initializationOptions": {**QUIET, **off},
                },
            )
        )
        await wire.response(0)
        wire.send(notification("initialized", {}))
        wire.send(request(1, "kode/stats"))
        await wire.response(1)  # ``initialized`` was handled
        engine = wire.server.engine
        assert engine.workspace is None
        on = {**QUIET, "enabled": True, "workspaceIndex": True}
        wire.send(notification("workspace/didChangeConfiguration", {"settings": on}))
        wire.send(request(2, "kode/stats"))
        await wire.response(2)
        assert engine.workspace is not None
        assert engine.workspace.roots == (root,)
        # Turned off again: the index is closed and no longer read.
        off_again = {**QUIET, "workspaceIndex": False}
        wire.send(notification("workspace/didChangeConfiguration", {"settings": off_again}))
        wire.send(request(3, "kode/stats"))
        await wire.response(3)
        assert engine.workspace is None


# Bug 4: an edit that could not be read closed the document but left its generation running.


async def test_an_unreadable_edit_stops_the_documents_generation() -> None:
    backend = ScriptedBackend(["a"] * 2000)
    async with Wire(backend) as wire:  # type: ignore[arg-type]
        await wire.initialize({**QUIET, "multiline": "always", "timeBudgetMs": 0})
        wire.send(did_open(URI, "value = "), inline(1, URI, 0, 8))
        await until(lambda: backend.generations)
        change = {
            "textDocument": {"uri": URI, "version": 2},
            "contentChanges": [{"range": {"start": "nowhere"}, "text": "Z"}],
        }
        wire.send(notification("textDocument/didChange", change))
        await wire.messages("window/showMessage")
        await until(lambda: backend.generations[0].cancelled)
        reply = await wire.response(1)  # answered, not left waiting on the generation
        assert "result" in reply or "error" in reply
