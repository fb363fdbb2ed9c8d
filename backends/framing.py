"""Length-prefixed frames: Kode's one rule for a stream of messages over a byte pipe.

A frame is a 4-byte big-endian (network order) unsigned length, then that many bytes of
payload. Used by the shared engine's socket (``daemon/protocol.py``, MessagePack
payloads) and by the workspace index's parsing child (``completion/project/index_worker.py``,
``marshal`` payloads over its pipes).

Standard library only, and importing nothing of Kode: the parsing child runs in an
isolated interpreter that imports no Kode package, and loads this file by its path.

>>> frame(b"abc")
b'\\x00\\x00\\x00\\x03abc'
>>> length(frame(b"abc")[:HEADER.size])
3
"""

from __future__ import annotations

import struct

HEADER = struct.Struct(">I")


def frame(payload: bytes) -> bytes:
    """``payload`` with its length in front."""
    return HEADER.pack(len(payload)) + payload


def length(header: bytes) -> int:
    """The payload length a frame's ``HEADER.size``-byte header gives."""
    (size,) = HEADER.unpack(header)
    return int(size)
