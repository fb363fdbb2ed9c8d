"""Server-sent events as remote completion servers write them: bytes in, events out.

``SSEDecoder`` follows the WHATWG event-stream rules, incrementally: feed it whatever
a socket read returned (an event may be split at any byte, even inside a UTF-8
sequence or between ``\\r`` and ``\\n``) and it returns the events completed so far.

    data: {"text": "de", "meta_info": {...}}     <- one event per blank-line-ended block
    <blank line>
    : keep-alive                                 <- comment: ignored
    event: error                                 <- named event
    data: {"error": {"message": "..."}}
    <blank line>
    data: [DONE]                                 <- end of stream (SGLang, OpenAI)

On top of the framing, ``decode_json`` turns an event into a typed payload (a
``msgspec.Struct`` derived from ``Payload``) and raises the ``RemoteError`` a
server's in-band error stands for: an ``event: error``, a JSON ``{"error": ...}``
(SGLang, OpenAI) or ``{"object": "error", ...}`` (vLLM) body, or data that is not
the JSON it should be.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable
from dataclasses import dataclass
from typing import TypeVar

import msgspec
from kode.backends.errors import RemoteAuthError, RemoteBusyError, RemoteError, StreamError

MAX_LINE_BYTES = 4 << 20  # a line longer than this is not a completion stream
DONE = "[DONE]"


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One dispatched event. ``data`` lines are joined with ``\\n``."""

    data: str
    event: str = "message"
    id: str | None = None

    @property
    def done(self) -> bool:
        """The ``data: [DONE]`` sentinel that ends SGLang and OpenAI streams."""
        return self.data.strip() == DONE


class SSEDecoder:
    """Incremental event-stream parser.

    >>> d = SSEDecoder()
    >>> d.feed(b'data: {"a"')
    []
    >>> [e.data for e in d.feed(b': 1}\\r\\n\\r\\ndata: [DONE]\\n\\n')]
    ['{"a": 1}', '[DONE]']
    """

    def __init__(self, max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_line_bytes
        self._skip_lf = False  # the last byte seen was a CR: an LF right after it is its pair
        self._first_line = True
        self._data: list[str] = []
        self._event = ""
        self._id: str | None = None
        self._last_id: str | None = None
        self.comments = 0  # comment lines seen (keep-alives)

    @property
    def pending(self) -> bool:
        """True while an event has started but not been ended by a blank line."""
        return bool(self._buf) or bool(self._data) or bool(self._event)

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Parse ``chunk`` (any slice of the stream); return the events it completed."""
        events: list[SSEEvent] = []
        buf = self._buf
        start = 0
        if self._skip_lf and chunk[:1] == b"\n":
            start = 1
        self._skip_lf = False
        n = len(chunk)
        while start < n:
            cr = chunk.find(b"\r", start)
            lf = chunk.find(b"\n", start)
            if cr < 0 and lf < 0:
                buf += chunk[start:]
                if len(buf) > self._max:
                    raise StreamError(f"event-stream line longer than {self._max} bytes")
                break
            end = lf if cr < 0 else cr if lf < 0 else min(cr, lf)
            buf += chunk[start:end]
            if len(buf) > self._max:
                raise StreamError(f"event-stream line longer than {self._max} bytes")
            if chunk[end] == 13:  # CR: swallow an LF that pairs with it, even in the next chunk
                if end + 1 < n:
                    start = end + 2 if chunk[end + 1] == 10 else end + 1
                else:
                    self._skip_lf = True
                    start = n
            else:
                start = end + 1
            event = self._line(bytes(buf))
            buf.clear()
            if event is not None:
                events.append(event)
        return events

    def _line(self, raw: bytes) -> SSEEvent | None:
        if self._first_line:
            self._first_line = False
            if raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
        line = raw.decode("utf-8", errors="replace")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            self.comments += 1
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._id = value
        # "retry" and unknown fields are ignored, as the standard says
        return None

    def _dispatch(self) -> SSEEvent | None:
        if self._id is not None:
            self._last_id = self._id
        data, event = self._data, self._event
        self._data, self._event, self._id = [], "", None
        if not data:
            return None
        return SSEEvent("\n".join(data), event or "message", self._last_id)


async def aiter_events(chunks: AsyncIterable[bytes]) -> AsyncGenerator[SSEEvent]:
    """Events from a byte stream (e.g. ``httpx.Response.aiter_raw()``).

    Ends at the end of the byte stream; a half-received event there is dropped, as
    the standard says (callers tell a cut stream by the missing ``[DONE]``).
    """
    decoder = SSEDecoder()
    async for chunk in chunks:
        for event in decoder.feed(chunk):
            yield event


# -- JSON payloads and in-band errors -------------------------------------------------


class ErrorBody(msgspec.Struct, frozen=True):
    """``{"error": {"message": ..., "type": ..., "code": ...}}`` as servers send it."""

    message: str = ""
    type: str = ""
    code: int | str | None = None


class Payload(msgspec.Struct, frozen=True):
    """Fields by which a server reports an error inside a stream; payloads extend it."""

    error: ErrorBody | str | None = None
    object: str = ""
    message: str = ""
    code: int | str | None = None


P = TypeVar("P", bound=Payload)


def error_for_status(status: int | None, message: str) -> RemoteError:
    """The exception an HTTP status (or an in-band error code) stands for."""
    if status in (401, 403):
        return RemoteAuthError(message)
    if status == 429:
        return RemoteBusyError(message)
    return RemoteError(message)


def _status(code: int | str | None) -> int | None:
    if isinstance(code, int):
        return code
    if isinstance(code, str) and code.isdigit():
        return int(code)
    return None


def decode_json(event: SSEEvent, decoder: msgspec.json.Decoder[P], server: str) -> P:
    """The typed payload of ``event``; raises the ``RemoteError`` an error event means.

    ``server`` names the server in messages (e.g. ``"SGLang at http://gpu:30000"``).
    Call it for events other than ``[DONE]``.
    """
    if event.event == "error":
        raise RemoteError(f"{server} reported an error: {_error_text(event.data)}")
    try:
        payload = decoder.decode(event.data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise StreamError(f"{server} sent a malformed event: {exc}") from None
    err = payload.error
    if err is not None:
        if isinstance(err, str):
            raise RemoteError(f"{server} reported an error: {err}")
        raise error_for_status(
            _status(err.code), f"{server} reported an error: {err.message or err.type}"
        )
    if payload.object == "error":
        raise error_for_status(
            _status(payload.code), f"{server} reported an error: {payload.message}"
        )
    return payload


def _error_text(data: str, limit: int = 300) -> str:
    """A short message from an error event's data (JSON or plain text)."""
    try:
        body = msgspec.json.decode(data, type=Payload)
    except (msgspec.DecodeError, msgspec.ValidationError):
        text = data.strip()
    else:
        err = body.error
        if isinstance(err, ErrorBody):
            text = err.message or err.type
        elif isinstance(err, str):
            text = err
        else:
            text = body.message or data.strip()
    return text[:limit] or "(no message)"
