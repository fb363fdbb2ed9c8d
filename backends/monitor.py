"""The names monitor: after ``receiver.``, only tokens that spell one of its members.

Monitor-guided decoding (Agrawal et al., NeurIPS 2023; microsoft/monitors4codegen): when
the text so far ends in a dereference whose receiver's members are known (a closed set,
worked out by static analysis in ``completion/project/receivers.py``), every token that cannot
continue one of their names is masked until the identifier ends. A 1.1B model with it
beat a 175B model without it on next-identifier match.

Pure, no engine: ``Names`` says what is known (sent with the request, over the shared
engine's socket too), ``VocabIndex`` is the vocabulary as a character trie (its pieces
sorted, built once per model), ``Monitor`` gives the mask for a generation's text so far.

The rule, for a text ending in ``recv.part`` where ``recv`` has members ``M``: a token
``t`` survives when ``part + t`` is a prefix of a name in ``M`` (``pa`` + ``th`` for
``path``), or a whole name of ``M`` followed by a character that cannot continue an
identifier (``path`` + ``.join`` is ``path.`` then ``join``: the constraint ends at the
dot, the next one begins). For a text ending in ``recv`` itself, a token that begins with
the dot (Qwen's vocabulary has ``.path``, ``.append``, ...) is judged the same way after
its dot; other tokens are free. End-of-generation tokens survive where the name is
complete, and before the model has written anything (no suggestion invents nothing);
never mid-name or right after a dot the model wrote, where stopping would leave a name
that does not exist (``os.pa``) or a dangling dot. Example::

    >>> index = VocabIndex([b"os", b".", b".pa", b"path", b"pat", b"h", b"(", b"x", b".x"])
    >>> names = Names(line="    p = os", members={"os": ("path", "sep")})
    >>> monitor = Monitor(index, names)
    >>> np.flatnonzero(monitor.allowed(b"")).tolist()  # free, but not ``.x``
    [0, 1, 2, 3, 4, 5, 6, 7]
    >>> np.flatnonzero(monitor.allowed(b".")).tolist()  # ``path`` and its prefixes
    [3, 4]
    >>> np.flatnonzero(monitor.allowed(b".path")).tolist()  # ended: not an ident char
    [1, 2, 6, 8]
    >>> monitor.allowed(b".path()") is None  # nothing constrained
    True

Where a new attribute is made (``self.`` at the start of a statement in ``__init__``),
nothing is masked: the name may be new. There the model's pick is weighed towards the
names the class uses that the method makes on no other line (``Names.unmade``: the
attribute the class reads and nothing makes yet), a cache language model mixed in
(Tu, Su and Devanbu, "On the localness of software", FSE 2014): ``p = (1 - UNMADE_WEIGHT)
* model + UNMADE_WEIGHT * unmade``, each name's share spread over the tokens that spell
it as the model itself would. Measured (``kode bench names``, docs/benchmarks.md): the
same weighing of the document's uses at closed receivers gained nothing on held-out
holes (one name lost), so it is not done there.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

Mask = npt.NDArray[np.bool_]

# A byte that may continue an identifier: ASCII letters, digits, ``_``, and any byte of a
# multi-byte UTF-8 character (Python identifiers may hold them; judged conservatively).
_IDENT_SET = frozenset(c for c in range(256) if c >= 128 or c == 95 or chr(c).isalnum())

# The share of the pick at an attribute being made that ``Names.unmade`` decides (module
# docstring). At 0.3 a name alone in it wins a greedy pick unless the model gives another
# token more than 0.43 more probability: the model still overrules a weak prior.
UNMADE_WEIGHT = 0.3

# ``recv.part`` at the end of a line: a dotted chain of identifiers not preceded by a dot,
# an identifier character or a closing bracket (``f().x.`` has no static receiver).
_DEREF = re.compile(r"(?<![\w.)\]}])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\.(\w*)\Z")
_CHAIN = re.compile(r"(?<![\w.)\]}])([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\Z")
_IMPORT_LINE = re.compile(r"\s*(?:from|import)\s")


@dataclass(frozen=True, slots=True)
class Names:
    """What is known at the cursor: for each receiver (``os``, ``os.path``, ``self``),
    every name its members may have. ``line``: the text of the cursor's line before the
    generation begins. ``open_at_start``: receivers that stay free where they begin a
    statement (``self.`` in ``__init__``, where new attributes are made). ``unmade``:
    for those, where they begin a statement, the names their class uses that the method
    makes on no other line, with weights (any scale): they weigh the model's pick there
    (``UNMADE_WEIGHT``)."""

    line: str
    members: dict[str, tuple[str, ...]]
    open_at_start: tuple[str, ...] = ()
    unmade: dict[str, dict[str, float]] = field(default_factory=dict)

    def opens(self, line: str, recv: str) -> bool:
        """Whether ``line`` begins a statement with ``recv.`` where ``recv`` is open
        there (an attribute being made: nothing masked)."""
        return recv in self.open_at_start and line.lstrip().startswith(recv + ".")

    @property
    def size(self) -> int:
        """How many names in all (what the debug log and the benchmarks report)."""
        return sum(len(m) for m in self.members.values())


def dereference(line: str) -> tuple[str, str] | None:
    """``(receiver, part)`` when ``line`` ends in ``receiver.part`` in code (not in a
    string, a comment or an import statement), else None.

    >>> dereference("    x = os.path.jo")
    ('os.path', 'jo')
    >>> dereference("f().x.") is None, dereference("s = 'os.") is None, dereference("1.") is None
    (True, True, True)
    """
    match = _DEREF.search(line)
    if match is None or not in_code(line, match.start()) or _IMPORT_LINE.match(line):
        return None
    return match.group(1), match.group(2)


def chain_end(line: str) -> str | None:
    """The dotted chain ``line`` ends in (in code), or None: ``x = os.path`` -> ``os.path``."""
    match = _CHAIN.search(line)
    if match is None or not in_code(line, match.start()) or _IMPORT_LINE.match(line):
        return None
    return match.group(1)


def in_code(line: str, end: int) -> bool:
    """Whether position ``end`` of ``line`` is outside strings and comments (one line's
    view: a string opened on an earlier line is not seen).

    >>> in_code("x = 'a' + os", 10), in_code("x = 'a + os", 10), in_code("# os", 3)
    (True, False, False)
    """
    quote = ""
    i = 0
    while i < end:
        c = line[i]
        if quote:
            if c == "\\":
                i += 1
            elif line.startswith(quote, i):
                i += len(quote) - 1
                quote = ""
        elif c == "#":
            return False
        elif c in "'\"":
            quote = c * 3 if line.startswith(c * 3, i) else c
            i += len(quote) - 1
        i += 1
    return not quote


class VocabIndex:
    """The vocabulary's pieces as a character trie: sorted, so that the tokens that
    begin with a text are one ``bisect`` range, and by exact piece. Built once per model
    (``LocalBackend.vocab_index``); ``skip`` marks end and control tokens, which always
    survive a mask."""

    def __init__(
        self, pieces: Sequence[bytes], skip: Callable[[int], bool] = lambda _token: False
    ) -> None:
        n = len(pieces)
        self.n_vocab, self.pieces = n, pieces
        kept = sorted((p, i) for i, p in enumerate(pieces) if p and not skip(i))
        self._sorted = [p for p, _ in kept]
        self._ids = np.fromiter((i for _, i in kept), dtype=np.intp, count=len(kept))
        self._exact: dict[bytes, list[int]] = {}
        for p, i in kept:
            self._exact.setdefault(p, []).append(i)
        self.stops = np.array([bool(skip(i)) or not pieces[i] for i in range(n)], dtype=bool)
        self._ended: Mask | None = None
        self._dotted: Mask | None = None

    def spelling(self, lead: bytes, rests: Iterable[bytes]) -> Mask:
        """Tokens that spell ``lead`` followed by a prefix of one of ``rests`` (at least
        one character of it, or ``lead`` alone), or by a whole one of ``rests`` and then
        a character that cannot continue an identifier. Never a stop token: a name is
        not complete here (``ended`` is where it may be).

        >>> index = VocabIndex([b"pa", b"path", b"path(", b"paths", b".p", b"."])
        >>> np.flatnonzero(index.spelling(b"", [b"path"])).tolist()
        [0, 1, 2]
        >>> np.flatnonzero(index.spelling(b".", [b"path"])).tolist()
        [4, 5]
        """
        mask = np.zeros(self.n_vocab, dtype=bool)
        exact = self._exact
        if lead:
            mask[exact.get(lead, [])] = True
        for rest in rests:
            word = lead + rest
            for k in range(len(lead) + 1, len(word) + 1):
                hit = exact.get(word[:k])
                if hit:
                    mask[hit] = True
            if not word:
                continue
            lo = bisect.bisect_left(self._sorted, word)
            n = len(word)
            pieces = self._sorted
            while lo < len(pieces) and pieces[lo].startswith(word):
                piece = pieces[lo]
                if len(piece) > n and piece[n] not in _IDENT_SET:
                    mask[self._ids[lo]] = True
                lo += 1
        return mask

    def ended(self) -> Mask:
        """Tokens that begin with a character that cannot continue an identifier (a name
        was complete: it may end here), and the stop tokens. Computed once."""
        if self._ended is None:
            mask = self.stops.copy()
            for p, i in zip(self._sorted, self._ids, strict=True):
                if p[0] not in _IDENT_SET:
                    mask[i] = True
            self._ended = mask
        return self._ended

    def dotted(self) -> Mask:
        """Tokens that begin with a dot. Computed once."""
        if self._dotted is None:
            mask = np.zeros(self.n_vocab, dtype=bool)
            lo = bisect.bisect_left(self._sorted, b".")
            while lo < len(self._sorted) and self._sorted[lo].startswith(b"."):
                mask[self._ids[lo]] = True
                lo += 1
            self._dotted = mask
        return self._dotted


@dataclass(frozen=True, slots=True)
class Prior:
    """The names likely at one place: for each, the tokens that spell it from there
    (``VocabIndex.spelling``) and its share (the shares sum to 1). ``group``: the tokens
    the prior speaks for (after ``recv`` itself: those that begin with a dot; the model
    alone decides whether a dot comes); None: every token."""

    spellings: tuple[npt.NDArray[np.intp], ...]
    shares: npt.NDArray[np.float64]
    group: Mask | None = None

    def mix(self, logits: npt.NDArray[np.float32], weight: float = UNMADE_WEIGHT) -> None:
        """``logits`` (masked: -inf where not allowed) become those of ``(1 - weight) *
        model + weight * prior`` within the group, in place, the group's mass unchanged.
        A name all of whose spellings are masked gives its share to the others; none
        left: unchanged."""
        inside = np.isfinite(logits)
        if self.group is not None:
            inside &= self.group
        if not inside.any():
            return
        finite = logits[inside].astype(np.float64)
        top = float(finite.max())
        lse = top + float(np.log(np.exp(finite - top).sum()))
        q: dict[int, float] = {}
        kept = 0.0
        for ids, share in zip(self.spellings, self.shares, strict=True):
            ids = ids[inside[ids]]
            p = np.exp(logits[ids].astype(np.float64) - lse)
            total = float(p.sum())
            if total <= 0.0:
                continue
            kept += share
            for token, pt in zip(ids.tolist(), (share * p / total).tolist(), strict=True):
                q[token] = q.get(token, 0.0) + pt
        if kept <= 0.0:
            return
        tokens = np.fromiter(q, dtype=np.intp, count=len(q))
        prior = np.fromiter(q.values(), dtype=np.float64, count=len(q)) / kept
        model = np.exp(logits[tokens].astype(np.float64) - lse)
        logits[inside] += np.float32(np.log1p(-weight))
        logits[tokens] = (np.log((1.0 - weight) * model + weight * prior) + lse).astype(np.float32)


@dataclass(slots=True)
class Fired:
    """What the monitor did in one generation (for the stats and the debug log)."""

    dereferences: int = 0  # dots after which a closed set constrained the identifier
    steps: int = 0  # picks made under a mask (after a known receiver, or its dot)
    names: list[int] = field(default_factory=list)  # names allowed at each dereference
    weighed: int = 0  # picks ``Names.unmade`` weighed (``Prior``)


class Monitor:
    """The mask for one generation's text so far (``Names.line`` + what it generated).

    ``allowed(generated)``: the tokens that may come next after ``generated`` (the bytes
    generated so far, the token being judged excluded), or None where nothing is
    constrained. Masks are cached by receiver and typed part: a verify batch asks the
    same question at several rows, and a sampled generation at every try.
    """

    def __init__(self, index: VocabIndex, names: Names) -> None:
        self.index, self.names = index, names
        self._line = names.line.encode()
        self._members = {k: tuple(n.encode() for n in v) for k, v in names.members.items()}
        self._cache: dict[tuple[str, bytes, bool], Mask | None] = {}
        self._unmade = {
            recv: {n.encode(): w for n, w in weights.items() if w > 0}
            for recv, weights in names.unmade.items()
            if recv in names.open_at_start
        }
        self._priors: dict[tuple[str, bytes, bool], Prior | None] = {}
        self.fired = Fired()
        self._last: tuple[int, str] | None = None  # (dot's offset, receiver) last counted

    def _last_line(self, generated: bytes) -> tuple[bytes, str] | None:
        """The text so far and its last line, where that line may end in a receiver or a
        dereference; None (the common case, decided at once) where it cannot."""
        text = self._line + generated
        cut = text.rfind(b"\n") + 1
        line = text[cut:].decode(errors="replace")
        if not line or not (line[-1] == "." or line[-1].isidentifier() or line[-1].isdigit()):
            return None
        return text, line

    def prior(self, generated: bytes) -> Prior | None:
        """Where an attribute is made (``recv.part`` beginning a statement, or ``recv``
        alone there, for the tokens that begin with a dot), the names likely made;
        None elsewhere (the model alone picks)."""
        found = self._last_line(generated) if self._unmade else None
        if found is None:
            return None
        line = found[1]
        deref = dereference(line)
        if deref is not None:
            recv, part = deref
            if recv not in self._unmade or self._constrains(line, recv):
                return None
            key = (recv, part.encode(), False)
        else:
            recv = line.lstrip()
            if recv not in self._unmade or chain_end(line) != recv:
                return None
            key = (recv, b"", True)
        if key not in self._priors:
            self._priors[key] = self._prior(*key)
        prior = self._priors[key]
        if prior is not None:
            self.fired.weighed += 1
        return prior

    def _prior(self, recv: str, part: bytes, dot: bool) -> Prior | None:
        lead = b"." if dot else b""
        spellings, weights = [], []
        for name, weight in self._unmade[recv].items():
            if name.startswith(part) and len(name) > len(part):
                ids = np.flatnonzero(self.index.spelling(lead, [name[len(part) :]]))
                if ids.size:
                    spellings.append(ids)
                    weights.append(weight)
        if not spellings:
            return None
        shares = np.asarray(weights, dtype=np.float64)
        group = self.index.dotted() if dot else None
        return Prior(tuple(spellings), shares / shares.sum(), group)

    def allowed(self, generated: bytes) -> Mask | None:
        found = self._last_line(generated)
        if found is None:
            return None
        text, line = found
        mask: Mask | None = None
        deref = dereference(line)
        if deref is not None and self._constrains(line, deref[0]):
            recv, part = deref
            mask = self._after_dot(recv, part.encode(), typed=not generated)
            if mask is not None:
                self._count(len(text) - len(part.encode()) - 1, recv)
        chain = chain_end(line)
        if chain is not None and chain in self._members and self._constrains(line, chain):
            dot = self._dot_mask(chain)
            mask = dot if mask is None else mask & dot
        if mask is not None:
            self.fired.steps += 1
        return mask

    def _constrains(self, line: str, recv: str) -> bool:
        return not self.names.opens(line, recv)

    def _after_dot(self, recv: str, part: bytes, typed: bool) -> Mask | None:
        """Tokens after ``recv.part``: None where ``recv`` is unknown or ``part`` begins
        no member (an unknown name the user typed: nothing to hold it to). ``typed``:
        nothing generated yet, so stopping at once is allowed (it shows nothing)."""
        members = self._members.get(recv)
        if members is None:
            return None
        key = (recv, part, typed)
        if key not in self._cache:
            rests = [m[len(part) :] for m in members if m.startswith(part)]
            if not rests:
                self._cache[key] = None
            else:
                mask = self.index.spelling(b"", [r for r in rests if r])
                if any(not r for r in rests):  # ``part`` is a whole name: it may end here
                    mask |= self.index.ended()
                elif typed:
                    mask |= self.index.stops
                self._cache[key] = mask
        return self._cache[key]

    def _dot_mask(self, recv: str) -> Mask:
        """After ``recv`` itself: tokens not beginning with a dot are free; those that do
        must spell a member's name after it."""
        key = (recv, b".", False)  # a part never holds a dot: no clash with _after_dot
        cached = self._cache.get(key)
        if cached is None:
            cached = ~self.index.dotted() | self.index.spelling(b".", self._members[recv])
            self._cache[key] = cached
        return cached

    def _count(self, at: int, recv: str) -> None:
        """A mask after the dot at ``at``: the first there is a dereference constrained."""
        if self._last != (at, recv):
            self._last = (at, recv)
            self.fired.dereferences += 1
            self.fired.names.append(len(self._members[recv]))
