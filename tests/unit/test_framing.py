"""LSP framing that resynchronises (issue #14, item 3): every kind of bad Content-Length,
then a good message that must still come through. Plus a hypothesis fuzz of random
frames. No server, no model."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kode.lsp.framing import FrameParser, Message, ParseError, Rejected


def frame(body: bytes, length: int | None = None, header: bytes | None = None) -> bytes:
    if header is None:
        header = b"Content-Length: %d\r\n" % (len(body) if length is None else length)
    return header + b"\r\n" + body


def request(n: int, text: str = "x") -> bytes:
    msg = {"jsonrpc": "2.0", "id": n, "method": "kode/stats", "params": {"t": text}}
    return json.dumps(msg, ensure_ascii=False).encode()


def ids(events: list[Any]) -> list[Any]:
    out = []
    for event in events:
        if isinstance(event, Message):
            out.append(event.value["id"])
        elif isinstance(event, ParseError):
            out.append(("parse-error", event.request_id))
    return out


def run(parser: FrameParser, data: bytes, *, idle: bool = False) -> list[Any]:
    events = list(parser.feed(data))
    if idle:
        events += list(parser.idle())
    return ids(events)


def test_good_frames_pass_through_even_byte_by_byte() -> None:
    data = frame(request(1)) + frame(request(2, "café 😀")) + frame(request(3))
    parser = FrameParser()
    events: list[Any] = []
    for i in range(len(data)):
        events += list(parser.feed(data[i : i + 1]))
    assert ids(events) == [1, 2, 3]
    assert parser.problems == 0
    assert not parser.waiting


def test_length_counted_in_characters_then_the_next_message() -> None:
    body = request(1, "café")  # é is 2 bytes: a client counting characters sends 1 short
    parser = FrameParser()
    assert run(parser, frame(body, len(body.decode()))) == []  # held: where does it end?
    assert run(parser, frame(request(2))) == [1, 2]
    assert parser.problems >= 1


def test_too_short_with_a_quiet_client_is_read_whole() -> None:
    body = request(7)
    parser = FrameParser()
    assert run(parser, frame(body, len(body) - 5), idle=True) == [7]
    assert run(parser, frame(request(8))) == [8]


def test_a_cut_body_answers_a_parse_error_with_its_id() -> None:
    body = request(7)[:-5]
    parser = FrameParser()
    assert run(parser, frame(body), idle=True) == [("parse-error", 7)]
    assert run(parser, frame(request(8))) == [8]


def test_too_long_with_a_quiet_client_is_taken_after_the_pause() -> None:
    body = request(1)
    parser = FrameParser()
    assert run(parser, frame(body, len(body) + 40)) == []
    assert parser.waiting
    assert run(parser, b"", idle=True) == [1]
    assert run(parser, frame(request(2))) == [2]


def test_too_long_with_a_chatty_client_does_not_swallow_the_next_messages() -> None:
    body = request(1)
    parser = FrameParser()
    data = frame(body, len(body) + 10_000) + frame(request(2)) + frame(request(3))
    assert run(parser, data) == [1, 2, 3]


def test_too_long_by_less_than_the_next_header() -> None:
    body = request(1)
    parser = FrameParser()
    assert run(parser, frame(body, len(body) + 3) + frame(request(2))) == [1, 2]


def test_non_numeric_missing_and_huge_lengths() -> None:
    parser = FrameParser()
    data = (
        frame(request(1), header=b"Content-Length: abc\r\n")
        + frame(request(2))
        + frame(request(3), header=b"Content-Type: application/json\r\n")
        + frame(request(4))
        + frame(request(5), length=99_999_999_999)
        + frame(request(6))
    )
    assert run(parser, data) == [1, 2, 3, 4, 5, 6]


def test_missing_length_with_a_quiet_client() -> None:
    parser = FrameParser()
    assert run(parser, b"\r\n" + request(1), idle=True) == [1]


def test_content_length_inside_a_document_is_not_a_header() -> None:
    text = 'headers = "Content-Length: 12\\r\\n"\nContent-Length: 5\r\n'
    body = request(1, text)
    parser = FrameParser()
    data = frame(body)
    events: list[Any] = []
    for i in range(0, len(data), 7):
        events += list(parser.feed(data[i : i + 7]))
    assert ids(events) == [1]
    assert events[0].value["params"]["t"] == text
    assert parser.problems == 0


def test_malformed_json_with_an_id_is_a_parse_error_for_that_id() -> None:
    parser = FrameParser()
    bad = b'{"jsonrpc": "2.0", "id": 12, "method": "kode/stats", "params": {,}'
    assert run(parser, frame(bad) + frame(request(13))) == [("parse-error", 12), 13]
    assert run(parser, frame(b'{"id": "abc", oops'), idle=True) == [("parse-error", "abc")]
    assert run(parser, frame(b"not json at all"), idle=True) == [("parse-error", None)]


def test_an_endless_header_line_is_bounded() -> None:
    parser = FrameParser(max_header_line=1024)
    for _ in range(100):
        list(parser.feed(b"x" * 4096))
    assert len(parser._buf) <= 1024 + 4096
    assert run(parser, b"\r\n" + frame(request(1))) == [1]


def test_a_decoder_hook_that_refuses_is_reported_not_raised() -> None:
    def hook(data: dict[str, Any]) -> Any:
        if data.get("method") == "bad":
            raise ValueError("refused")
        return data

    parser = FrameParser(json.JSONDecoder(object_hook=hook))
    events = list(parser.feed(frame(b'{"id": 1, "method": "bad"}') + frame(request(2))))
    assert isinstance(events[0], Rejected)
    assert ids(events[1:]) == [2]


_junk = st.one_of(
    st.binary(max_size=40),
    st.sampled_from(
        [
            b"Content-Length: \r\n",
            b"Content-Length: -3\r\n",
            b"Content-Length: 99999999999999999999\r\n",
            b"content-length:5\r\n\r\n",
            b"\r\n\r\n",
            b"{",
            b'{"id": 1',
            b"\xff\xfe\x00",
        ]
    ),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), _junk),  # garbage before the message
            st.integers(-20, 20),  # error in its Content-Length
            st.text(max_size=30),  # its text: any code points, surrogates and NULs
        ),
        max_size=6,
    ),
    st.integers(1, 64),
)
def test_fuzz_framing_always_recovers(
    messages: list[tuple[bytes | None, int, str]], chunk: int
) -> None:
    """Whatever came before, a good frame sent after a quiet moment is read."""
    parser = FrameParser()
    stream = b""
    for n, (junk, error, text) in enumerate(messages):
        body = json.dumps({"jsonrpc": "2.0", "id": n, "method": "m", "params": text}).encode()
        stream += (junk or b"") + frame(body, max(0, len(body) + error))
    for i in range(0, len(stream), chunk):
        list(parser.feed(stream[i : i + chunk]))
    list(parser.idle())
    list(parser.idle())
    events = list(parser.feed(frame(request(999))))
    if not events:
        events = list(parser.idle())
    assert 999 in ids(events), (stream, events)
