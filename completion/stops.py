"""When a completion ends, and what of it is shown.

- Special tokens (end of text, FIM markers) end it: the backend stops on control
  tokens, and ``stop_texts`` catch them should they appear as text.
- Single-line mode (``multiline: never``): the first line break ends it.
- Mid-line (the cursor sits before other text on its line, ``multiline: auto``): the
  fill may span lines, but only when the model decides it: it must end the fill itself
  (its end token) and the fill must join the text after the cursor. Otherwise (it ran
  on to ``max_lines`` or ``max_tokens``, or two blank lines) only its first line is
  shown. A fill that runs into the suffix (it writes the rest of the cursor's line and
  the line after it) is cut where the suffix begins; so is one that ran on past the
  hole, where it wrote the rest of the cursor's line, a line break and then the
  suffix's next line of code, if the document parses so. Its line breaks and indentation
  are kept to the last character: they are what joins it to the suffix, unless the
  document parses only without the blanks after its last line break (the suffix
  brings its own indentation).
- Multi-line mode: it ends at the end of the block (a line indented less than the
  cursor's block), after two blank lines, after ``max_lines``, or when a generated
  line repeats the next line of the suffix (the model ran into the existing code).
  One exception: a dedented line that opens a block (``while n > 1:``) at an indent
  where the suffix's next line of code would be its body (the suffix continues deeper
  than that line) may be the hole's own code. Generation goes on; the fill is kept
  whole only when the model ends it itself (or it runs into the suffix) and the
  document parses with it, else it is cut at that dedent as before.
- Finally, a one-line fill that duplicates what already follows the cursor is trimmed,
  and so are its trailing blanks, unless a word follows the cursor (they separate it).

Structural stops (``structural``, the setting ``structuralStops``): generation stops as
soon as the code says the fill can no longer be shown past where it is, instead of
running on to ``max_tokens`` and being cut afterwards (0.5B, ``kode bench quality
--modes before,engine``: 62% of the tokens generated for random spans and 96% for
mid-line holes of real files were never shown). What is shown is what the rules above
make of the text so far, the model not having ended it, except where a rule says
otherwise (a first line ending with the rest of the cursor's line, the suffix's later
lines). Where the model would have ended the fill after a structural stop, the
multi-line fill it would have ended is not shown (measured: 4 fills in 108 tasks, each
one that ran past the hole; none passed before, one passes after).

- Mid-line, at the first line break, when the first line wrote the rest of the cursor's
  line again (the one-line trim would cut it, or it ends with that rest, a word in it):
  the model took the hole to end on this line, and what it writes next is the code
  after it. Shown: the first line, trimmed.
- Mid-line, past the first line: a complete line that ends with the rest of the
  cursor's line (blanks aside; 5 characters or more besides them): the hole ends there,
  and the fill is cut where that rest begins (it spans lines where the document parses
  with it, as where a fill runs into the suffix).
- Mid-line, after 12 lines the model has not ended (``maxLines`` if smaller): holes
  spanning more are rare (under 1% of HumanEval's random spans), fills running on common.
- Mid-line, past the first line: a complete line indented less than the cursor's line
  and the suffix's next line of code that starts at column 0 (not a closing bracket) or
  starts a definition (the fill left the definition the hole is in); or a complete line
  that is the suffix's next line of code, where that line appears nowhere before the
  cursor (the fill ran into the suffix; a line that repeats, ``return False``, may be
  the hole's own).
- Multi-line, also: two complete lines that are the suffix's second and third lines of
  code (12 characters or more together), as for its next line above: cut before them
  (the fill ran into the suffix, having written its next line its own way).
- Multi-line, after a dedent that opened a block the suffix continues in: a complete
  line back at that dedent's indentation that opens no block (the block it opened has
  closed, so the suffix can no longer be its body): cut at the dedent.

A block is opened by a line ending in ``:`` (Python) or ``{`` (brace languages).
"""

from __future__ import annotations

import enum
import itertools
import re
from dataclasses import dataclass

from kode.backends.stop_strings import find_stop
from kode.completion.syntax import FillCheck

_TAB = 4
# Structural stops: the most lines a mid-line fill waits for the model to end it. Of the
# random-span holes (HumanEval, seeds 0 and 1, 160 each) 3.75% span more than 8 lines,
# under 1% more than 12; the stdlib ``file`` holes at most 4. A fill the model has not
# ended by then shows its first line, as it would at ``max_tokens`` (0.5B, ``file``:
# 128-token fills ran 10+ lines). 8 cut a passing 9-line fill (1.5B, HumanEval/81).
_MID_LINE_LINES = 12
# Structural stops: the rest of the cursor's line, written at the end of a later line of
# a mid-line fill, ends the hole there when it holds at least this many characters other
# than blanks (``):`` or ``])`` end too many lines to tell).
_MIN_REST_CHARS = 5
# Structural stops: the suffix's second and third lines of code, written one after the
# other, tell that the fill ran into the suffix when together at least this long (one
# short line repeats too often in real code: ``return False``).
_MIN_LATER_CHARS = 12
# Places ``_joined_later`` parses the document at, at most (about 1 ms each, on the
# event loop).
_MAX_JOIN_PARSES = 8


class MultilineMode(enum.StrEnum):
    AUTO = "auto"  # mid-line: multi-line only when the model ends the fill, else multi-line
    ALWAYS = "always"
    NEVER = "never"


def indent_width(line: str) -> int:
    """Columns of leading whitespace (tabs count as 4)."""
    width = 0
    for ch in line:
        if ch == " ":
            width += 1
        elif ch == "\t":
            width += _TAB
        else:
            break
    return width


@dataclass(frozen=True, slots=True)
class Cut:
    """How much of the generated text to keep, and whether generation should stop."""

    keep: int
    stop: bool
    joined: bool = False  # cut where the text began repeating the suffix
    # Where the fill is cut unless the model ends it (a dedent that opened a block the
    # suffix continues in; see the module doc); None: no such dedent.
    fallback: int | None = None


@dataclass(frozen=True, slots=True)
class StopRules:
    single_line: bool
    base_indent: int  # indentation of the block the cursor is in
    line_prefix: str
    line_suffix: str
    next_suffix_line: str  # first non-blank suffix line after the cursor line, stripped
    stop_texts: tuple[str, ...] = ()
    # The most lines of a multi-line fill; None: no line bound (max_tokens still bounds
    # it). The completion path passes the maxLines setting (completion/settings.py owns
    # its default; this module cannot import it, settings.py imports MultilineMode).
    max_lines: int | None = None
    mid_line: bool = False  # multi-line only if the model ends the fill (see the module doc)
    suffix_head: str = ""  # mid-line: the rest of the cursor line, its break and the next line
    suffix_indent: int | None = None  # indent of the suffix's next line of code; None: none
    structural: bool = False  # stop as soon as the shown text is decided (module doc)
    # The suffix's second and third lines of code (stripped; structural stops only, and
    # only when long enough to be told apart, ``_MIN_LATER_CHARS``); else ().
    later_suffix_lines: tuple[str, ...] = ()
    # The suffix's next line of code appears nowhere before the cursor: a fill writing it
    # ran into the suffix (``return False`` may be the hole's own line too).
    next_line_distinct: bool = False
    # Mid-line: the rest of the cursor's line without its blanks, when long enough to
    # tell a later line that ends with it (``_MIN_REST_CHARS``; structural stops only);
    # else "".
    line_rest: str = ""

    @classmethod
    def build(
        cls,
        line_prefix: str,
        line_suffix: str,
        suffix: str,
        *,
        mode: MultilineMode = MultilineMode.AUTO,
        stop_texts: tuple[str, ...] = (),
        max_lines: int | None = None,
        structural: bool = False,
        prefix: str = "",
    ) -> StopRules:
        """Rules for a cursor after ``line_prefix`` and before ``line_suffix`` on its line.

        ``prefix``: the text before the cursor (the prompt's), for ``next_line_distinct``.
        ``max_lines``: the most lines of a multi-line fill (the ``maxLines`` setting);
        None: no line bound.

        Example: cursor in ``print(|)`` gives mid-line rules (``)`` follows it);
        cursor at the start of an empty, 4-space indented line gives multi-line rules
        ending at the first line indented less than 4.
        """
        mid_line = mode is MultilineMode.AUTO and line_suffix.strip() != ""
        single = mode is MultilineMode.NEVER
        rest = suffix.split("\n")[1:] if "\n" in suffix else []
        head = ""
        if mid_line and rest and rest[0].strip():
            head = line_suffix + "\n" + rest[0]
        code_lines = [line.strip() for line in rest if line.strip()]
        code = next((line for line in rest if line.strip()), None)
        next_line = "" if code is None else code.strip()
        base = indent_width(line_prefix)
        line_rest = "".join(line_suffix.split())
        if line_prefix.rstrip().endswith((":", "{", "(", "[")):
            base += 1  # the cursor opens a block: its body is deeper
        return cls(
            single_line=single,
            base_indent=base,
            line_prefix=line_prefix,
            line_suffix=line_suffix,
            next_suffix_line=next_line,
            stop_texts=stop_texts,
            max_lines=max_lines,
            mid_line=mid_line,
            suffix_head=head,
            suffix_indent=None if code is None else indent_width(code),
            structural=structural,
            later_suffix_lines=_later_lines(code_lines) if structural else (),
            next_line_distinct=structural
            and len(next_line) >= 3
            and not re.search(rf"^[ \t]*{re.escape(next_line)}[ \t]*$", prefix, re.MULTILINE),
            line_rest=line_rest
            if structural and mid_line and len(line_rest) >= _MIN_REST_CHARS
            else "",
        )

    def scan(self, text: str) -> Cut:
        """Apply the rules to the text generated so far (called as it grows)."""
        hit = find_stop(text, self.stop_texts, 0)
        keep, stop = (len(text), False) if hit is None else (hit[0], True)
        text = text[:keep]
        if self.single_line:
            at = text.find("\n")
            return Cut(at, True) if at != -1 else Cut(keep, stop)
        if self.mid_line:
            return self._scan_mid_line(text, stop)
        lines = text.split("\n")
        base = self.base_indent
        if not self.line_prefix.strip() and lines[0].strip():
            # Cursor on a blank line: the block is where the completion starts.
            base = indent_width(self.line_prefix + lines[0])
        offset = len(lines[0]) + 1
        blank_run, blank_start = 0, 0
        fallback: int | None = None
        for number, line in enumerate(lines[1:], start=1):
            complete = number < len(lines) - 1  # a line break follows it
            stripped = line.strip()
            if stripped:
                blank_run = 0
                width = indent_width(line)
                if width < base:
                    if fallback is None and complete and self._opens_suffix_block(line, width):
                        fallback, base = offset - 1, width
                    elif fallback is None and not complete and self._may_open(width):
                        return Cut(offset - 1, False)  # not yet known: wait for the line
                    else:
                        return Cut(offset - 1, True, fallback=fallback)  # the block ended
                elif (
                    self.structural
                    and fallback is not None
                    and complete
                    and width == base
                    and not _opens_block(line)
                ):
                    return Cut(offset - 1, True, fallback=fallback)  # its block closed
                if complete and (
                    self._runs_into_suffix(stripped) or self._writes_later_lines(lines, number)
                ):
                    return Cut(offset - 1, True, joined=True, fallback=fallback)
            elif complete:
                blank_run += 1
                if blank_run == 1:
                    blank_start = offset
                elif blank_run >= 2:
                    return Cut(blank_start - 1, True, fallback=fallback)
            if self.max_lines is not None and number >= self.max_lines:
                return Cut(offset - 1, True, fallback=fallback)
            offset += len(line) + 1
        return Cut(keep, stop, fallback=fallback)

    def _may_open(self, width: int) -> bool:
        """A dedent to ``width`` could open a block the suffix continues in."""
        return self.suffix_indent is not None and 0 < width < self.suffix_indent

    def _opens_suffix_block(self, line: str, width: int) -> bool:
        """``line`` (a whole line, indented ``width``, less than the block) opens a block
        whose body the suffix's next line of code would be (see the module doc). Not at
        column 0: a new top-level definition there is the model writing on past the hole."""
        return self._may_open(width) and _opens_block(line)

    def _left_block(self, line: str) -> bool:
        """A mid-line fill's later ``line`` (whole) is outside the definition the hole is
        in: indented less than the cursor's line and the suffix's next line of code, it
        starts at column 0 and closes no bracket (``}`` may end the hole's block), or it
        starts a definition (``def``, ``class``, ``function``, ``fn``, ``func``)."""
        limit = indent_width(self.line_prefix)
        if self.suffix_indent is not None:
            limit = min(limit, self.suffix_indent)
        width = indent_width(line)
        if width >= limit:
            return False
        return (width == 0 and line[:1] not in _CLOSE) or _DEFINITION.match(line) is not None

    def _rewrote_line_end(self, first: str) -> int | None:
        """Where to cut a fill whose first line ``first`` ends by writing the rest of the
        cursor's line again, None if it does not: the one-line rules would trim it (cut
        after it: they still will), or it ends with that rest whole and the rest holds a
        word (cut where the rest begins, as where the fill runs into the suffix).

        Example: the cursor in ``x = |foo(y)``, the first line ``z + foo(y)``: cut to
        ``z + ``.
        """
        rest = self.line_suffix.strip()
        line = first.rstrip()
        if not rest:
            return None
        if _trim_overlap(self.line_prefix, line, self.line_suffix.rstrip()) != line:
            return len(first)
        if _WORD_START.search(rest) is not None and line.endswith(rest):
            return len(line) - len(rest)
        return None

    def provisional(self, text: str) -> str:
        """What of ``text`` may be shown while the model is still generating: a mid-line
        fill's later lines wait for the model to end it (``finish``)."""
        cut = self.scan(text)
        text = text[: cut.keep if cut.fallback is None else cut.fallback]
        if self.mid_line and "\n" in text:
            return text[: text.index("\n")]
        return text

    def _scan_mid_line(self, text: str, stop: bool) -> Cut:
        """Mid-line: run on across lines (the model decides), up to ``max_lines``, two
        blank lines, or the suffix written out again (cut where it starts)."""
        if self.suffix_head:
            at = text.find(self.suffix_head)
            if at != -1:
                return Cut(at, True, joined=True)
        lines = text.split("\n")
        limit = self.max_lines
        if self.structural:
            limit = _MID_LINE_LINES if limit is None else min(limit, _MID_LINE_LINES)
        if limit is not None and len(lines) > limit:
            return Cut(len(text), True)
        if any(not a.strip() and not b.strip() for a, b in itertools.pairwise(lines[1:-1])):
            return Cut(len(text), True)
        if self.structural:
            keep = None if len(lines) == 1 else self._rewrote_line_end(lines[0])
            if keep is not None:
                return Cut(keep, True)
            offset = len(lines[0]) + 1
            for line in lines[1:-1]:  # the complete lines after the first
                rest_at = self._ends_with_line_rest(line)
                if rest_at is not None:
                    return Cut(offset + rest_at, True, joined=True)
                stripped = line.strip()
                if stripped and (
                    self._left_block(line)
                    or (self.next_line_distinct and self._runs_into_suffix(stripped))
                ):
                    return Cut(len(text), True)
                offset += len(line) + 1
        return Cut(len(text), stop)

    def _ends_with_line_rest(self, line: str) -> int | None:
        """Where a later whole ``line`` of a mid-line fill begins writing the rest of the
        cursor's line (blanks aside: ``i % 3`` for ``i%3``), when it ends with it; None
        if it does not or the rest is too short to tell (``line_rest`` empty). The hole
        ends there: what follows is the suffix. Where the rest starts with blanks, the
        fill's own before it go (the suffix brings them).

        Example: the cursor in ``result.a| % 4 == 0:``, the line ``        elif i % 4 == 0:``
        gives the place of ``%``, less the blank before it: the fill ends ``elif i``.
        """
        rest = self.line_rest
        if not rest:
            return None
        body = line.rstrip()
        i, k = len(body), len(rest)
        while k and i:
            i -= 1
            if body[i].isspace():
                continue
            k -= 1
            if body[i] != rest[k]:
                return None
        if k:
            return None
        blank_rest = self.line_suffix[:1].isspace()
        if blank_rest:
            i = len(body[:i].rstrip(" \t"))
        elif not body[:i].strip():
            return None  # the line is the rest alone: not where the hole ends
        return i

    def _joined_later(self, text: str, fits: FillCheck | None) -> str | None:
        """A multi-line fill that ran on past the hole: ``text`` up to where it writes
        the rest of the cursor's line and a line break, when the code it writes next is
        the suffix's next line (or the suffix has no code after its first line) and the
        document parses with the fill cut there; None if there is no such place.

        Example: the hole runs from ``max(depth, |`` to the middle of ``depth -=| 1``
        two lines down (so `` 1`` follows the cursor, then ``return depth``). The model
        wrote ``max_depth)\n    else:\n        depth -= 1\n    return depth\n...``:
        the fill is ``max_depth)\n    else:\n        depth -=``.
        """
        rest = self.line_suffix.rstrip()
        if fits is None or not rest:
            return None
        needle = rest + "\n"
        at, parses = text.find(needle), 0
        while at != -1 and parses < _MAX_JOIN_PARSES:
            fill = text[:at]
            if "\n" in fill:  # one line joined so: the one-line rules decide
                lines = text[at + len(needle) :].split("\n")[:-1]  # complete lines
                following = next((line.strip() for line in lines if line.strip()), None)
                # Nothing after the suffix's first line: what it wrote after it goes.
                if not self.next_suffix_line or following == self.next_suffix_line:
                    parses += 1
                    if fits(fill):
                        return fill
            at = text.find(needle, at + 1)
        return None

    def _runs_into_suffix(self, stripped: str) -> bool:
        return len(self.next_suffix_line) >= 3 and stripped == self.next_suffix_line

    def _writes_later_lines(self, lines: list[str], number: int) -> bool:
        """Line ``number`` of ``lines`` and the complete one after it are the suffix's
        second and third lines of code (the fill wrote its next line its own way)."""
        if not self.later_suffix_lines or number + 2 >= len(lines):
            return False
        return (lines[number].strip(), lines[number + 1].strip()) == self.later_suffix_lines

    def finish(self, text: str, *, ended: bool = False, fits: FillCheck | None = None) -> str:
        """The text to show once generation ended: cut, then trimmed against the suffix.

        ``ended``: the model ended the generation itself (its end token), rather than
        ``max_tokens``, a stop rule or a cancel; a mid-line fill spans lines only then,
        or when it ran into the suffix. ``fits``: whether the document with a fill in
        place parses (``completion.syntax``); a multi-line fill must not parse worse
        than its first line alone.
        """
        cut = self.scan(text)
        if cut.fallback is not None:
            whole = text[: cut.keep]
            if (cut.joined or (ended and not cut.stop)) and fits is not None:
                # dict.fromkeys: one parse when the seam has no blanks to drop
                for fill in dict.fromkeys((whole, _seam_without_indent(whole))):
                    if fits(fill):
                        return fill.rstrip()
        text = text[: cut.keep if cut.fallback is None else cut.fallback]
        if self.mid_line and "\n" in text:
            first = text[: text.index("\n")]
            if cut.joined or (ended and not cut.stop):
                if fits is None or fits(text):
                    return text
                seam = _seam_without_indent(text)
                if seam != text and fits(seam):
                    return seam  # the suffix brings its own indentation
                if not fits(first):
                    return text
            later = self._joined_later(text, fits)
            if later is not None:
                return later
            text = first
        if "\n" not in text:
            # Trailing blanks go, unless a word follows the cursor: ``for e in `` + ``l:``
            # needs its space, or the fill's last word and the suffix's first one merge.
            kept = text if _WORD_START.match(self.line_suffix) else text.rstrip()
            return _trim_overlap(self.line_prefix, kept, self.line_suffix.rstrip())
        return text.rstrip()


def _later_lines(code_lines: list[str]) -> tuple[str, ...]:
    """``StopRules.later_suffix_lines`` from the suffix's lines of code (stripped)."""
    later = tuple(code_lines[1:3])
    return later if len(later) == 2 and sum(map(len, later)) >= _MIN_LATER_CHARS else ()


def _opens_block(line: str) -> bool:
    """``if x:`` (Python) or ``} else {`` (brace languages) opens a block."""
    return line.rstrip().endswith((":", "{"))


def _seam_without_indent(text: str) -> str:
    """``text`` without the blanks after its last line break, when nothing else follows
    it: the model's guess at the next line's indentation, which the suffix already holds
    (``"x -= 1\n  "`` before ``"        if x:"`` indents that line 10 instead of 8)."""
    head, _, tail = text.rpartition("\n")
    return head + "\n" if not tail.strip() else text


_OPEN, _CLOSE = "([{", ")]}"
_WORD_START = re.compile(r"\w")
_DEFINITION = re.compile(
    r"\s*(?:export\s+|pub(?:\([^)]*\))?\s+|async\s+)*(?:def|class|function|fn|func)\b"
)


def _excess_closers(text: str) -> int:
    """Closing brackets without an opener before them: ``_excess_closers("a))") == 2``."""
    depth, excess = 0, 0
    for ch in text:
        if ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            if depth:
                depth -= 1
            else:
                excess += 1
    return excess


def _trim_overlap(line_prefix: str, text: str, line_suffix: str) -> str:
    """Drop the end of ``text`` that repeats the start of ``line_suffix``, where keeping it
    would be wrong: it adds unmatched closing brackets, or it is punctuation only.

    Examples: cursor in ``foo(|)``, model wrote ``a, b)``: shown ``a, b``. Model wrote
    ``bar()`` there: kept, the ``)`` belongs to ``bar(``.
    """
    before = _excess_closers(line_prefix + text + line_suffix)
    for k in range(min(len(text), len(line_suffix)), 0, -1):
        overlap = line_suffix[:k]
        if not text.endswith(overlap):
            continue
        trimmed = text[:-k]
        if _excess_closers(line_prefix + trimmed + line_suffix) < before or not any(
            ch.isalnum() or ch in _OPEN + _CLOSE for ch in overlap
        ):
            return trimmed.rstrip() if not trimmed.strip() else trimmed
    return text
