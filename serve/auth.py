"""API keys for ``kode serve``.

The keys file holds one ``name:key`` per line; blank lines and ``#`` comments are
ignored. Only the sha256 digest of each key is kept in memory, and a presented key
is compared with every digest by ``hmac.compare_digest`` (no early exit), so
neither memory dumps nor response timing give a key away. Names appear in logs and
metrics; keys never do.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import stat
from dataclasses import dataclass
from pathlib import Path

from kode.backends.errors import SettingsError

log = logging.getLogger("kode.serve")

ANONYMOUS = "anonymous"  # the caller's name when the server runs without keys
MIN_KEY_LENGTH = 16


@dataclass(frozen=True, slots=True)
class KeyRing:
    """Named sha256 digests of the accepted keys."""

    digests: tuple[tuple[str, bytes], ...]

    @classmethod
    def parse(cls, text: str, *, source: str = "keys file") -> KeyRing:
        """Keys from ``name:key`` lines; a bad line is an error naming its line number."""
        entries: list[tuple[str, bytes]] = []
        names: set[str] = set()
        seen: set[bytes] = set()
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            name, colon, key = line.partition(":")
            name, key = name.strip(), key.strip()
            where = f"{source}, line {number}"
            if not colon or not name or not key:
                raise SettingsError(f"{where}: expected 'name:key'")
            if not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
                raise SettingsError(f"{where}: a name may hold letters, digits, '-', '_', '.'")
            if len(key) < MIN_KEY_LENGTH:
                raise SettingsError(
                    f"{where}: the key of {name!r} has fewer than {MIN_KEY_LENGTH} characters"
                )
            if name in names:
                raise SettingsError(f"{where}: the name {name!r} appears twice")
            digest = hashlib.sha256(key.encode()).digest()
            if digest in seen:
                raise SettingsError(f"{where}: the key of {name!r} is also another name's key")
            names.add(name)
            seen.add(digest)
            entries.append((name, digest))
        if not entries:
            raise SettingsError(f"{source}: no keys (one 'name:key' per line)")
        return cls(tuple(entries))

    @classmethod
    def load(cls, path: Path) -> KeyRing:
        """Keys from ``path``: UTF-8 (a byte-order mark is fine); a file others may
        read is used, with a warning, since its keys are no longer secret."""
        try:
            data = path.read_bytes()
            mode = path.stat().st_mode
        except OSError as exc:
            raise SettingsError(f"cannot read the API keys file {path}: {exc.strerror}") from None
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise SettingsError(
                f"the API keys file {path} is not UTF-8 text (byte {exc.start}); save it "
                "as UTF-8, one 'name:key' per line"
            ) from None
        if mode & (stat.S_IRGRP | stat.S_IROTH):
            log.warning(
                "the API keys file %s can be read by other users (mode %o); run: chmod 600 %s",
                path,
                stat.S_IMODE(mode),
                path,
            )
        return cls.parse(text, source=str(path))

    def identify(self, presented: str) -> str | None:
        """The name whose key ``presented`` is, or None."""
        digest = hashlib.sha256(presented.encode()).digest()
        found: str | None = None
        for name, known in self.digests:
            if hmac.compare_digest(digest, known) and found is None:
                found = name
        return found

    def identify_header(self, authorization: str | None) -> str | None:
        """The caller named by an ``Authorization: Bearer <key>`` header, or None."""
        if not authorization:
            return None
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return self.identify(token.strip())
