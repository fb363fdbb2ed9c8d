"""Every place fast (end to end, the real ``kode lsp`` and the 0.5B): the cursor
notification prepares a place before the keystroke, and a document's evaluated prompt
survives work in another document (saved KV states)."""

from __future__ import annotations

import argparse
import asyncio
import csv
import shlex
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient
from test_lsp_e2e import SERVER, TIMEOUT, inline_params, open_doc, start, stats

pytestmark = [pytest.mark.model]

# Real material nobody here wrote: two modules of the standard library.
DOC_A = Path(textwrap.__file__).read_text()
DOC_B = Path(shlex.__file__).read_text()
DOC_C = Path(csv.__file__).read_text()
DOC_LARGE = Path(argparse.__file__).read_text()  # 2,600 lines
URI_A = "file:///tmp/kode-e2e/project/textwrap_copy.py"
URI_B = "file:///tmp/kode-e2e/project/shlex_copy.py"
URI_C = "file:///tmp/kode-e2e/project/csv_copy.py"
SETTINGS: dict[str, Any] = {"model": "small", "maxTokens": 8, "snippetTokens": 0}


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER))
async def client(lsp_client: LanguageClient) -> AsyncIterator[None]:
    yield
    async with asyncio.timeout(30):
        await lsp_client.shutdown_session()


def end_of(text: str, line: int) -> types.Position:
    return types.Position(line, len(text.splitlines()[line]))


async def wait_for(
    client: LanguageClient, ready: Any, what: str, timeout_s: float = TIMEOUT
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        report = await stats(client)
        if ready(report):
            return report
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {report}")


async def prepared(client: LanguageClient) -> dict[str, Any]:
    """Stats once background preparation has finished all it had to do."""
    return await wait_for(
        client,
        lambda r: r["engine"]["prepared"] >= 1 and not r["engine"]["preparing"],
        "the preparation",
    )


async def complete_at(client: LanguageClient, uri: str, pos: types.Position) -> dict[str, Any]:
    async with asyncio.timeout(TIMEOUT):
        await client.text_document_inline_completion_async(
            inline_params(pos.line, pos.character, uri)
        )
    last: dict[str, Any] = (await stats(client))["counters"]["last"]
    return last


async def test_the_cursor_notification_prepares_the_place_before_the_keystroke(
    client: LanguageClient,
) -> None:
    await start(client, "visual-studio-code", {**SETTINGS, "readAhead": False})
    open_doc(client, DOC_A, URI_A)
    await wait_for(client, lambda r: r["engine"]["prefillTokensPerS"], "the prefill speed")
    place = end_of(DOC_A, 300)
    position = {"line": place.line, "character": place.character}
    client.protocol.notify(
        "kode/didMoveCursor", {"textDocument": {"uri": URI_A}, "position": position}
    )
    await prepared(client)
    last = await complete_at(client, URI_A, place)
    # Everything before the keystroke was prepared: only the prompt's last token (its
    # logits start the generation) is evaluated again.
    assert last["promptTokens"] > 300
    assert last["evaluatedPromptTokens"] <= 4, last
    # Malformed or unknown-document notifications are ignored; the server keeps serving.
    client.protocol.notify("kode/didMoveCursor", {"textDocument": {}, "position": None})
    client.protocol.notify(
        "kode/didMoveCursor",
        {"textDocument": {"uri": "file:///nope.py"}, "position": {"line": 0, "character": 0}},
    )
    assert (await stats(client))["engine"]["prepared"] >= 1


async def test_a_documents_prompt_survives_work_in_another_document(
    client: LanguageClient,
) -> None:
    await start(client, "neovim", {**SETTINGS, "readAhead": False, "firstAnswerMs": 0})
    open_doc(client, DOC_A, URI_A)
    open_doc(client, DOC_B, URI_B)
    open_doc(client, DOC_C, URI_C)
    first = await complete_at(client, URI_A, end_of(DOC_A, 300))
    assert first["evaluatedPromptTokens"] > 300
    # Two more documents: whatever number of live sequences the engine has (the shared
    # engine keeps one per slot, two; an in-process one, one), C takes A's: every live
    # sequence then holds another document than A.
    for doc, uri, line in ((DOC_B, URI_B, 200), (DOC_C, URI_C, 200)):
        other = await complete_at(client, uri, end_of(doc, line))
        assert other["evaluatedPromptTokens"] > 300, other
    # Back in A one line up (the same place would be answered from A's suggestion
    # without the model): A's prompt was saved when another document took its sequence
    # and comes back; only the cursor's surroundings (the suffix window starts a line
    # earlier) are evaluated again, not the 1,000 tokens before them.
    back = await complete_at(client, URI_A, end_of(DOC_A, 299))
    assert back["evaluatedPromptTokens"] <= 100, back
    assert back["reusedPromptTokens"] >= back["promptTokens"] - 100, back
    memory = (await stats(client))["kvMemory"]
    assert memory["restores"] >= 1 and memory["saves"] >= 1
    assert 0 < memory["bytes"] <= memory["budgetBytes"]


async def test_a_jump_into_lines_read_in_the_background_is_prepared_assembled(
    client: LanguageClient,
) -> None:
    """Issue #29 through the language server and the default (shared) engine: while the
    user reads, the document is read into the chunk store around the cursor; a jump into
    lines read there prepares the full window assembled from their chunks, and the
    keystroke there is answered from it."""
    text = DOC_LARGE
    uri = "file:///tmp/kode-e2e/project/argparse_copy.py"
    # A window of ~2,000 tokens: more than a reading pause evaluates on any CPU here.
    settings = {**SETTINGS, "readAhead": False, "prefixTokens": 2000, "chunkMemoryMb": 64}
    await start(client, "visual-studio-code", settings)
    open_doc(client, text, uri)
    await wait_for(client, lambda r: r["engine"]["prefillTokensPerS"], "the prefill speed")

    def move(line: int) -> types.Position:
        place = end_of(text, line)
        client.protocol.notify(
            "kode/didMoveCursor",
            {
                "textDocument": {"uri": uri},
                "position": {"line": place.line, "character": place.character},
            },
        )
        return place

    move(1200)
    # Reading runs at prefill speed, after everything a window asks for: beside two busy
    # processes (#31's loaded runs) 3 of the 4 regions took 120 s.
    read = await wait_for(client, lambda r: r["engine"]["regionsRead"] >= 4, "reading", 360)
    assert read["chunkStore"]["chunks"] >= 4
    assert 0 < read["chunkStore"]["bytes"] <= read["chunkStore"]["budgetBytes"]
    place = move(1290)  # a window of lines read around line 1200, at another anchor
    await wait_for(
        client, lambda r: r["engine"]["assembledPreparations"] >= 1, "an assembled window"
    )
    last = await complete_at(client, uri, place)
    assert last["promptTokens"] > 1500
    assert last["evaluatedPromptTokens"] <= 4, last  # the assembled window was the slot's
    report = await stats(client)
    assert report["chunkStore"]["assembled"] >= 1
