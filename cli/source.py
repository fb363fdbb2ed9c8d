"""A source file for a command: its text and URI, or a one-line error."""

from __future__ import annotations

import sys
from pathlib import Path

from kode.backends.errors import KodeError


def read_source(path: Path) -> tuple[str, str]:
    """The file's text and URI, or a one-line error.

    UTF-8 (with or without a byte-order mark); a file that is not UTF-8 is read as
    Latin-1, which every byte sequence is, and a note says so: old sources in Latin-1
    (or cp1252) are common, and their few accented bytes rarely matter to a completion.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise KodeError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise KodeError(f"{path} is a directory, not a file") from None
    except OSError as exc:
        raise KodeError(f"cannot read {path}: {exc.strerror}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
        print(f"kode: note: {path} is not UTF-8; read it as Latin-1", file=sys.stderr)
    return text, path.resolve().as_uri()
