"""The SSE parser against transcripts in SGLang's and OpenAI's formats, split anywhere."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kode.backends.errors import RemoteAuthError, RemoteBusyError, RemoteError, StreamError
from kode.backends.remote.sse import (
    Payload,
    SSEDecoder,
    SSEEvent,
    aiter_events,
    decode_json,
    error_for_status,
)

# What SGLang's http_server writes for a streamed /generate: one "data: {json}\n\n" per
# output (cumulative text), then "data: [DONE]\n\n".
SGLANG = (
    b'data: {"text": "def", "output_ids": [750], "meta_info": {"id": "r1", '
    b'"finish_reason": null, "prompt_tokens": 12, "completion_tokens": 1, "cached_tokens": 0}}\n\n'
    b'data: {"text": "def f\xc3\xa9e", "output_ids": [282], "meta_info": {"id": "r1", '
    b'"finish_reason": {"type": "length", "length": 2}, "prompt_tokens": 12, '
    b'"completion_tokens": 2, "cached_tokens": 0, "spec_verify_ct": 1}}\n\n'
    b"data: [DONE]\n\n"
)

# sse-starlette (llama.cpp's server) style: CRLF, keep-alive comments, named events.
OPENAI = (
    b": ping - 2024-01-01 00:00:00\r\n\r\n"
    b'data: {"choices": [{"text": " x", "index": 0, "finish_reason": null}]}\r\n\r\n'
    b": keep-alive\r\n"
    b"\r\n"
    b'data: {"choices": [{"text": "", "index": 0, "finish_reason": "stop"}]}\r\n\r\n'
    b"data: [DONE]\r\n\r\n"
)

ERRORS = (
    b"event: error\n"
    b'data: {"error": {"message": "out of memory", "code": 500}}\n\n'
    b'data: {"error": {"message": "prompt too long"}}\n\n'
)


class Out(Payload, frozen=True):
    text: str = ""


DECODER = msgspec.json.Decoder(Out)


def parse(stream: bytes, splits: list[int] | None = None) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    at = 0
    for cut in sorted(splits or []):
        events += decoder.feed(stream[at:cut])
        at = cut
    events += decoder.feed(stream[at:])
    return events


def test_sglang_transcript() -> None:
    events = parse(SGLANG)
    assert len(events) == 3
    assert events[-1].done
    first, second = (decode_json(e, DECODER, "test") for e in events[:2])
    assert first.text == "def"
    assert second.text == "def fée"


def test_openai_transcript_with_crlf_and_keepalives() -> None:
    decoder = SSEDecoder()
    events = decoder.feed(OPENAI)
    assert [e.done for e in events] == [False, False, True]
    assert decoder.comments == 2
    assert not decoder.pending


def test_multiline_data_named_events_ids_and_bom() -> None:
    stream = (
        b"\xef\xbb\xbfid: 7\nevent: delta\ndata: line one\ndata:line two\n"
        b"retry: 100\nunknown: x\n\n"
        b"data\n\n"  # a field name alone: empty data
        b"event: only-a-name\n\n"  # no data: nothing dispatched
    )
    events = parse(stream)
    assert events == [SSEEvent("line one\nline two", "delta", "7"), SSEEvent("", "message", "7")]


def test_lone_cr_line_endings_and_cr_split_from_lf() -> None:
    assert parse(b"data: a\r\rdata: b\r\n\r\n") == [SSEEvent("a"), SSEEvent("b")]
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n\r") == [SSEEvent("a")]
    assert decoder.feed(b"\n") == []  # the LF paired with the CR before it
    assert not decoder.pending


def test_unfinished_event_is_pending() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"text": "cut') == []
    assert decoder.pending


def test_error_event_and_json_error_payloads() -> None:
    events = parse(ERRORS)
    with pytest.raises(RemoteError, match="out of memory"):
        decode_json(events[0], DECODER, "SGLang")
    with pytest.raises(RemoteError, match="prompt too long"):
        decode_json(events[1], DECODER, "SGLang")


@pytest.mark.parametrize(
    ("data", "error"),
    [
        ('{"object": "error", "message": "slow down", "code": 429}', RemoteBusyError),
        ('{"error": {"message": "bad key", "code": 401}}', RemoteAuthError),
        ('{"error": {"message": "nope", "code": "403"}}', RemoteAuthError),
        ('{"error": "plain string error"}', RemoteError),
    ],
)
def test_error_codes_map_to_the_exception_tree(data: str, error: type[RemoteError]) -> None:
    with pytest.raises(error) as info:
        decode_json(SSEEvent(data), DECODER, "server")
    assert type(info.value) is error


@pytest.mark.parametrize("data", ["{not json", "[1, 2]", '{"text": 5}', "\x00\xff"])
def test_malformed_payloads_are_stream_errors(data: str) -> None:
    with pytest.raises(StreamError):
        decode_json(SSEEvent(data), DECODER, "server")


def test_garbage_bytes_never_crash_the_framing() -> None:
    events = parse(bytes(range(256)) * 4 + b"\n\n")
    assert all(isinstance(e.data, str) for e in events)


def test_endless_line_is_refused() -> None:
    decoder = SSEDecoder(max_line_bytes=1000)
    decoder.feed(b"data: " + b"x" * 900)
    with pytest.raises(StreamError, match="longer than 1000"):
        decoder.feed(b"x" * 200)


@pytest.mark.parametrize("status", [401, 403, 429, 500, 502, None])
def test_error_for_status(status: int | None) -> None:
    error = error_for_status(status, "m")
    expected = {401: RemoteAuthError, 403: RemoteAuthError, 429: RemoteBusyError}
    assert type(error) is expected.get(status or 0, RemoteError)


async def test_aiter_events_over_a_chunked_byte_stream() -> None:
    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(SGLANG), 7):
            yield SGLANG[i : i + 7]

    events = [e async for e in aiter_events(chunks())]
    assert events == parse(SGLANG)


TRANSCRIPTS = [SGLANG, OPENAI, ERRORS, SGLANG.replace(b"\n", b"\r\n"), SGLANG.replace(b"\n", b"\r")]


@settings(max_examples=300, deadline=None)
@given(
    which=st.sampled_from(range(len(TRANSCRIPTS))),
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=30),
)
def test_any_split_gives_the_same_events(which: int, cuts: list[int]) -> None:
    stream = TRANSCRIPTS[which]
    cuts = [c % (len(stream) + 1) for c in cuts]
    assert parse(stream, cuts) == parse(stream)


@settings(max_examples=50, deadline=None)
@given(which=st.sampled_from(range(len(TRANSCRIPTS))))
def test_byte_by_byte(which: int) -> None:
    stream = TRANSCRIPTS[which]
    assert parse(stream, list(range(len(stream)))) == parse(stream)
