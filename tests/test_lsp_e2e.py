"""End to end: the real `kode lsp` subprocess, real clients' capabilities, the real 0.5B model."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

pytestmark = [pytest.mark.model]

SERVER = [sys.executable, "-m", "kode.cli.main", "lsp"]
TIMEOUT = 120  # seconds for any one step, generous for a loaded 2-core CI machine
# Full windows always (no first-answer budget): these tests count evaluated tokens.
SETTINGS: dict[str, Any] = {
    "model": "small",
    "maxTokens": 48,
    "snippetTokens": 0,
    "firstAnswerMs": 0,
}
URI = "file:///tmp/kode-e2e/project/mathutils.py"
SOURCE = '''"""Small math helpers."""


def add(a, b):
    """Return the sum of a and b."""
'''


def capabilities(client: str) -> types.ClientCapabilities:
    """A real client's capability preset, plus inline completion (LSP 3.18)."""
    caps = client_capabilities(client)
    assert caps.text_document is not None
    caps.text_document.inline_completion = types.InlineCompletionClientCapabilities(
        dynamic_registration=False
    )
    return caps


async def start(client: LanguageClient, preset: str, options: dict[str, Any]) -> None:
    async with asyncio.timeout(TIMEOUT):
        await client.initialize_session(
            types.InitializeParams(
                capabilities=capabilities(preset),
                initialization_options=options,
                process_id=None,
            )
        )


def open_doc(client: LanguageClient, text: str, uri: str = URI, version: int = 1) -> None:
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            types.TextDocumentItem(uri=uri, language_id="python", version=version, text=text)
        )
    )


def inline_params(line: int, character: int, uri: str = URI) -> types.InlineCompletionParams:
    return types.InlineCompletionParams(
        context=types.InlineCompletionContext(
            trigger_kind=types.InlineCompletionTriggerKind.Automatic
        ),
        text_document=types.TextDocumentIdentifier(uri=uri),
        position=types.Position(line=line, character=character),
    )


async def stats(client: LanguageClient) -> dict[str, Any]:
    async with asyncio.timeout(TIMEOUT):
        result = await client.protocol.send_request_async("kode/stats", None)
    # pygls hands back custom results as attrs-like objects; normalise to dicts.
    return _plain(result)


def _plain(value: Any) -> Any:
    if hasattr(value, "_asdict"):
        return {k: _plain(v) for k, v in value._asdict().items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@pytest_lsp.fixture(config=ClientServerConfig(server_command=SERVER))
async def client(lsp_client: LanguageClient) -> AsyncIterator[None]:
    yield
    async with asyncio.timeout(30):
        await lsp_client.shutdown_session()


@pytest.mark.parametrize("preset", ["visual-studio-code", "neovim"])
async def test_inline_completion_from_the_real_model(client: LanguageClient, preset: str) -> None:
    await start(client, preset, SETTINGS)
    open_doc(client, "")
    # Incremental sync: type the file in two edits.
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=2),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(types.Position(0, 0), types.Position(0, 0)),
                    text=SOURCE,
                ),
                types.TextDocumentContentChangePartial(
                    range=types.Range(types.Position(5, 0), types.Position(5, 0)),
                    text="    ",
                ),
            ],
        )
    )
    async with asyncio.timeout(TIMEOUT):
        result = await client.text_document_inline_completion_async(inline_params(5, 4))
    assert isinstance(result, types.InlineCompletionList)
    assert len(result.items) == 1
    text = result.items[0].insert_text
    assert isinstance(text, str)
    assert "return" in text and "a" in text and "b" in text, text
    report = await stats(client)
    assert report["counters"]["generations"] >= 1
    assert report["counters"]["last"]["completionTokens"] >= 3


async def test_a_selected_completion_item_is_extended(client: LanguageClient) -> None:
    """VS Code shows inline suggestions only if they extend the item its suggest widget
    has selected (`selectedCompletionInfo`): `if n` with `number` selected is answered
    with `number...` over the item's range, made for the text `if number`."""
    await start(client, "visual-studio-code", SETTINGS)
    open_doc(client, 'def fibonacci(number):\n    """The n-th number."""\n    if n\n')
    item = types.Range(types.Position(2, 7), types.Position(2, 8))
    params = inline_params(2, 8)
    params.context.selected_completion_info = types.SelectedCompletionInfo(item, "number")
    async with asyncio.timeout(TIMEOUT):
        result = await client.text_document_inline_completion_async(params)
    assert isinstance(result, types.InlineCompletionList) and len(result.items) == 1, result
    answer = result.items[0]
    assert answer.range == item, answer
    assert isinstance(answer.insert_text, str) and answer.insert_text.startswith("number")
    assert len(answer.insert_text) > len("number"), answer
    # The cursor notification is counted (what the real-editor tests check).
    start_of_file = {"line": 0, "character": 0}
    client.protocol.notify(
        "kode/didMoveCursor", {"textDocument": {"uri": URI}, "position": start_of_file}
    )
    async with asyncio.timeout(TIMEOUT):
        while (await stats(client))["engine"]["cursorMoves"] < 1:
            await asyncio.sleep(0.05)


async def test_cancel_answers_32800_and_stops_within_one_step(client: LanguageClient) -> None:
    options = {
        **SETTINGS,
        "maxTokens": 400,
        "multiline": "always",
        "maxLines": 400,
        "partialCompletions": True,
        "speculation": "none",  # one token per step, so steps can be counted exactly
    }
    partials: list[Any] = []

    @client.feature("kode/inlineCompletionPartial")
    def on_partial(params: Any) -> None:
        partials.append(params)

    await start(client, "visual-studio-code", options)
    lines = "".join(f"    {i},\n" for i in range(1, 13))
    open_doc(client, f"numbers = [\n{lines}")
    msg_id = str(uuid.uuid4())
    pending = client.protocol.send_request(
        "textDocument/inlineCompletion", inline_params(13, 0), msg_id=msg_id
    )
    async with asyncio.timeout(TIMEOUT):
        while not partials:
            await asyncio.sleep(0.02)
    partial = _plain(partials[0])
    assert partial["requestId"] == msg_id
    assert partial["text"].strip()  # the generation is running: a line is already out
    client.protocol.notify("$/cancelRequest", types.CancelParams(id=msg_id))
    with pytest.raises(JsonRpcException) as raised:
        async with asyncio.timeout(TIMEOUT):
            await asyncio.wrap_future(pending)
    assert raised.value.code == -32800
    # Nothing runs after the cancel: the window knows the engine holds this prompt, so it
    # prepares nothing (a preparation would be recorded last, finished by ``length``;
    # the shared engine once did that, #15).
    await asyncio.sleep(1.0)

    for _ in range(100):  # the worker finishes its last step, then accounts
        report = await stats(client)
        if report["counters"]["cancelled"] >= 1:
            break
        await asyncio.sleep(0.05)
    last = report["counters"]["last"]
    assert last["finishReason"] == "cancelled"
    assert last["stepsAfterCancel"] <= 1
    assert 0 < last["completionTokens"] < 400
    # One token per step (plus the first, from the prompt): no step ran unaccounted for.
    assert last["decodeSteps"] == last["completionTokens"] - 1

    # The KV cache is consistent: the next (short) request reuses the prompt and completes.
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"kode": {**options, "maxTokens": 8}})
    )
    async with asyncio.timeout(TIMEOUT):
        again = await client.text_document_inline_completion_async(inline_params(13, 0))
    assert again is not None and again.items
    report = await stats(client)
    assert report["counters"]["last"]["reusedPromptTokens"] > 0


async def test_latest_wins_on_one_document(client: LanguageClient) -> None:
    await start(client, "neovim", SETTINGS)
    open_doc(client, SOURCE + "    ")
    first = client.protocol.send_request("textDocument/inlineCompletion", inline_params(5, 4))
    second = client.protocol.send_request("textDocument/inlineCompletion", inline_params(5, 4))
    async with asyncio.timeout(TIMEOUT):
        first_result = await asyncio.wrap_future(first)
        second_result = await asyncio.wrap_future(second)
    assert first_result is not None and not first_result.items  # abandoned
    assert second_result is not None and len(second_result.items) == 1
    report = await stats(client)
    # The first generation never ran past its first step, if it started at all.
    assert report["counters"]["generations"] in (1, 2)


async def test_bad_input_gets_clear_errors_and_the_server_keeps_serving(
    client: LanguageClient,
) -> None:
    await start(client, "visual-studio-code", {**SETTINGS, "maxTokens": "many", "nope": 1})

    def said(word: str) -> bool:
        return any(word in m.message for m in client.messages)

    async with asyncio.timeout(TIMEOUT):  # both problems are said, however slow the server
        while not (said("maxTokens") and said("nope")):
            await client.wait_for_notification("window/showMessage")

    open_doc(client, SOURCE + "    ")
    with pytest.raises(JsonRpcException) as unknown:
        async with asyncio.timeout(TIMEOUT):
            await client.text_document_inline_completion_async(
                inline_params(0, 0, uri="file:///tmp/never-opened.py")
            )
    assert unknown.value.code == -32602 and "not open" in unknown.value.message

    with pytest.raises(JsonRpcException) as outside:
        async with asyncio.timeout(TIMEOUT):
            await client.text_document_inline_completion_async(inline_params(99, 0))
    assert outside.value.code == -32602 and "outside" in outside.value.message

    # Malformed params, written raw (the test client would refuse to send them).
    reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    client.protocol._request_futures["bad-1"] = reply
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": "bad-1",
            "method": "textDocument/inlineCompletion",
            "params": {"textDocument": {"uri": URI}},
        }
    ).encode()
    assert client.protocol.writer is not None
    client.protocol.writer.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    with pytest.raises(JsonRpcException) as malformed:
        async with asyncio.timeout(TIMEOUT):
            await reply
    assert malformed.value.code in (-32602, -32603)

    async with asyncio.timeout(TIMEOUT):
        result = await client.text_document_inline_completion_async(inline_params(5, 4))
    assert result is not None and result.items


def type_char(client: LanguageClient, version: int, line: int, character: int, text: str) -> None:
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=URI, version=version),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(
                        types.Position(line, character), types.Position(line, character)
                    ),
                    text=text,
                )
            ],
        )
    )


KEYSTROKE_DOC = (
    SOURCE
    + """    \n\n\ndef mul(a, b):
    \"\"\"Return the product of a and b.\"\"\"
    return a * b


def div(a, b):
    \"\"\"Return a divided by b; b must not be zero.\"\"\"
    return a / b
"""
)


async def keystroke(client: LanguageClient, version: int, character: int) -> dict[str, Any]:
    """Type "#" at line 5 (no suggestion of the model can start with it), complete after
    it, and return the backend's counters for that completion."""
    type_char(client, version, 5, character, "#")
    async with asyncio.timeout(TIMEOUT):
        await client.text_document_inline_completion_async(inline_params(5, character + 1))
    last: dict[str, Any] = (await stats(client))["counters"]["last"]
    return last


async def test_a_keystroke_re_evaluates_only_what_changed(client: LanguageClient) -> None:
    # Read-ahead off: the first request pays for the whole prompt.
    options = {**SETTINGS, "maxTokens": 4, "readAhead": False, "movedSuffixDrift": 0}
    await start(client, "visual-studio-code", options)
    open_doc(client, KEYSTROKE_DOC)
    async with asyncio.timeout(TIMEOUT):
        await client.text_document_inline_completion_async(inline_params(5, 4))
    first = (await stats(client))["counters"]["last"]
    assert first["reusedPromptTokens"] == 0
    # Exact: everything before the keystroke is reused; the typed token and all that
    # follows it (<|fim_suffix|>, the suffix, <|fim_middle|>) is evaluated again.
    exact = await keystroke(client, 2, 4)
    assert exact["movedPromptTokens"] == 0
    assert exact["reusedPromptTokens"] + exact["evaluatedPromptTokens"] == exact["promptTokens"]
    assert exact["evaluatedPromptTokens"] > 25
    # Moved suffix: only the typed token, the 8 tokens from <|fim_suffix|> on and
    # <|fim_middle|> are evaluated; the rest of the suffix keeps its entries.
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"kode": {**options, "movedSuffixDrift": 32}})
    )
    moved = await keystroke(client, 3, 5)
    assert moved["movedPromptTokens"] >= 10
    assert moved["evaluatedPromptTokens"] <= 8 + 4
    assert moved["reusedPromptTokens"] + moved["evaluatedPromptTokens"] == moved["promptTokens"]
    assert moved["evaluatedPromptTokens"] < exact["evaluatedPromptTokens"] - 10


async def test_read_ahead_evaluates_a_new_document_before_the_first_keystroke(
    client: LanguageClient,
) -> None:
    await start(client, "visual-studio-code", {**SETTINGS, "maxTokens": 4})
    open_doc(client, KEYSTROKE_DOC)
    for _ in range(200):
        report = await stats(client)
        if report["engine"]["readAheads"] == 1 and report["counters"]["generations"] == 1:
            break
        await asyncio.sleep(0.1)
    assert report["engine"]["readAheads"] == 1
    assert report["counters"]["generations"] == 1
    async with asyncio.timeout(TIMEOUT):
        await client.text_document_inline_completion_async(inline_params(10, 16))
    last = (await stats(client))["counters"]["last"]
    # The file was read ahead: the first request, at the end of mul's body, reuses
    # everything before the cursor (about 60 tokens; without read-ahead it reuses
    # nothing, see the test above) and evaluates only what follows it. (A prompt takes
    # the read-ahead's sequence over an empty one only where it serves 32 tokens more,
    # ``kv_reuse.choose_slot``: at line 5 it would not.)
    assert last["reusedPromptTokens"] >= 45
    assert last["reusedPromptTokens"] + last["evaluatedPromptTokens"] == last["promptTokens"]
