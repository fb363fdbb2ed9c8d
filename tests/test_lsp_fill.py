"""End to end through ``kode lsp``: a fill that starts mid-line and spans lines.

The real server runs as a subprocess; its remote backend points at a scripted SGLang
server (``tests/kode_servers.FakeUpstream``), so what the "model" writes, and whether it
ends the fill itself, is fixed: the test checks what the editor is given (the range and
the text), not what a model happens to write. ``tests/test_lsp_e2e.py`` runs the real
0.5B.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest_lsp
from kode_servers import (
    FakeRequest,
    FakeUpstream,
    end_chunks,
    send_chunk,
    send_status,
    sglang_event,
    start_sse,
)
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

SERVER = [sys.executable, "-m", "kode.cli.main", "lsp"]
TIMEOUT = 60
URI = "file:///tmp/kode-fill/project/clamp.py"
# The cursor sits before `value` on the function's last line: the missing branch spans
# lines and must end where `value` continues it.
BEFORE = '''def clamp(value, low, high):
    """Return value limited to the range [low, high]."""
    if value < low:
        return low
    '''
AFTER = "value\nprint(clamp(5, 0, 3))\n"
FILL = "elif value > high:\n        return high\n    return "


def sglang_script(text: str, finish: str) -> Callable[[FakeRequest, Any], Awaitable[None]]:
    """An SGLang server that streams ``text`` line by line, then ends with ``finish``
    (``stop``: the model's end token; ``length``: max_tokens)."""

    async def handler(request: FakeRequest, writer: Any) -> None:
        if request.path != "/generate":
            await send_status(writer, 200, {})
            return
        rid = request.json()["rid"]
        await start_sse(writer)
        pieces = text.splitlines(keepends=True)
        for n, piece in enumerate(pieces, start=1):
            await send_chunk(writer, sglang_event(piece, rid, n))
        meta = {"type": finish, "length": len(pieces)} if finish == "length" else {"type": finish}
        await send_chunk(writer, sglang_event("", rid, len(pieces), meta))
        await send_chunk(writer, b"data: [DONE]\n\n")
        await end_chunks(writer)

    return handler


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER))
async def client(lsp_client: LanguageClient) -> AsyncIterator[None]:
    yield
    async with asyncio.timeout(30):
        await lsp_client.shutdown_session()


async def complete(client: LanguageClient, url: str) -> tuple[types.Position, str]:
    """Open BEFORE + AFTER, ask for a completion at the cursor, check it is inserted
    there replacing nothing, and return the cursor and the text."""
    caps = client_capabilities("visual-studio-code")
    assert caps.text_document is not None
    caps.text_document.inline_completion = types.InlineCompletionClientCapabilities()
    options = {"backend": "remote", "remote": {"url": url}, "snippetTokens": 0}
    async with asyncio.timeout(TIMEOUT):
        await client.initialize_session(
            types.InitializeParams(
                capabilities=caps, initialization_options=options, process_id=None
            )
        )
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=URI, language_id="python", version=1, text=BEFORE + AFTER)
        )
    )
    lines = BEFORE.split("\n")
    cursor = types.Position(line=len(lines) - 1, character=len(lines[-1]))
    params = types.InlineCompletionParams(
        context=types.InlineCompletionContext(
            trigger_kind=types.InlineCompletionTriggerKind.Invoked
        ),
        text_document=types.TextDocumentIdentifier(uri=URI),
        position=cursor,
    )
    async with asyncio.timeout(TIMEOUT):
        result = await client.text_document_inline_completion_async(params)
    assert isinstance(result, types.InlineCompletionList) and len(result.items) == 1
    item = result.items[0]
    # Inserted at the cursor, replacing nothing: the code after it stays as it is.
    assert item.range == types.Range(cursor, cursor)
    assert isinstance(item.insert_text, str)
    return cursor, item.insert_text


def assert_joins(text: str) -> None:
    """The fill does not write out the start of the code after the cursor again, and the
    document with it in place parses."""
    assert not any(text.endswith(AFTER[:k]) for k in range(1, len(AFTER))), text
    filled = BEFORE + text + AFTER
    compile(filled, "clamp.py", "exec")
    assert filled.count("value\n") == 1 and filled.count("print(") == 1, filled


async def test_a_fill_the_model_ends_is_kept_whole_with_its_seam(client: LanguageClient) -> None:
    async with FakeUpstream(sglang_script(FILL, "stop")) as fake:
        _, text = await complete(client, fake.url)
    # All of it, the line break and indentation before `value` included.
    assert text == FILL
    assert_joins(text)


async def test_a_fill_that_runs_into_the_code_after_the_cursor_is_cut_there(
    client: LanguageClient,
) -> None:
    ran_on = FILL + AFTER + "print(clamp(-1, 0, 3))\n"
    async with FakeUpstream(sglang_script(ran_on, "length")) as fake:
        _, text = await complete(client, fake.url)
    assert text == FILL
    assert_joins(text)


async def test_a_fill_the_model_does_not_end_shows_its_first_line(
    client: LanguageClient,
) -> None:
    async with FakeUpstream(sglang_script(FILL + "x = 1\n", "length")) as fake:
        _, text = await complete(client, fake.url)
    assert text == "elif value > high:"
