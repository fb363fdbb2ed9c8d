"""Token healing: which tokens may begin a generation that must start with given text.

When the cursor sits inside a word (``self.pro|``), the prompt's last token is a fragment
(``pro``) that the model rarely saw end a prefix in training: it saw ``.process`` or
``.property`` as one token. Healing removes that fragment from the prompt (the completion
layer backs the prefix off to a token boundary, ``completion/healing.py``) and constrains
the first generated token(s) to spell it again: each must either start with what is
still to be spelled (``process`` for ``pro``) or be a prefix of it (``p``, then ``ro...``).
The generated text therefore begins with the removed text, and the caller strips it.

``HealIndex`` answers "which token ids fit" in O(log V + len(text)) from the vocabulary's
pieces, sorted once per model; pure, no engine.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence


class HealIndex:
    """The vocabulary's pieces (bytes), indexed for ``allowed``.

    ``pieces[i]`` is what token ``i`` spells; empty pieces and ids for which ``skip``
    holds (end and control tokens) never fit.

    Example::

        >>> index = HealIndex([b"p", b"pro", b"process", b"print", b"ro", b"<eos>"])
        >>> sorted(index.allowed(b"pro"))
        [0, 1, 2]
        >>> index.rest(b"pro", 0)
        b'ro'
        >>> index.rest(b"pro", 2)
        b''
    """

    def __init__(
        self, pieces: Sequence[bytes], skip: Callable[[int], bool] = lambda _token: False
    ) -> None:
        self._pieces = pieces
        kept = [(p, i) for i, p in enumerate(pieces) if p and not skip(i)]
        kept.sort()
        self._sorted = [p for p, _ in kept]
        self._ids = [i for _, i in kept]
        self._exact: dict[bytes, list[int]] = {}
        for p, i in kept:
            self._exact.setdefault(p, []).append(i)

    def allowed(self, text: bytes) -> list[int]:
        """Token ids whose piece starts with ``text`` or is a shorter prefix of it
        (empty ``text``: none, the constraint is met)."""
        if not text:
            return []
        lo = bisect.bisect_left(self._sorted, text)
        hi = lo
        while hi < len(self._sorted) and self._sorted[hi].startswith(text):
            hi += 1
        found = self._ids[lo:hi]
        for k in range(1, len(text)):
            found.extend(self._exact.get(text[:k], ()))
        return found

    def rest(self, text: bytes, token: int) -> bytes:
        """What of ``text`` is still to be spelled after ``token`` (one of ``allowed(text)``)."""
        piece = self._pieces[token]
        return b"" if piece.startswith(text) else text[len(piece) :]
