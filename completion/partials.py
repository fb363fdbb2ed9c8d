"""When a request's growing suggestion is worth a ``kode/inlineCompletionPartial``.

A request waits for its whole suggestion; with ``partialCompletions`` the editor is shown
the text while it grows. On a slow machine a line of 10 tokens takes over a second (the
1.5B decodes at 35-120 ms a token on 2 cores), and a person typing at 120 ms a key never
waits that long: each key cancels the request before its line completes. So the text
goes out as soon as there is some, then at most every ``EVERY_S`` while its first line
grows, and at once whenever a line completes; a suggestion that was already ahead of the
typist (a typed-ahead key, or a request joining a suggestion started before it) goes out
at once. Once a line is complete, only whole lines follow: in the real VS Code, Tab once
took a partial that was not the newest, and a line cut in the middle is broken code.
A fill in the middle of a line sends none (the engine does not ask): its text is trimmed
against the rest of the line only when it ends.
"""

from __future__ import annotations

# Between two partials of one request at least this long, unless a line completed or the
# suggestion was already there when the request came.
EVERY_S = 0.25


class PartialPacer:
    """Decides, for one request, which of its suggestion's states to send as partials.

    ``typed``: what the user typed into the suggestion before this request (the partial
    is the text after it). ``continuing``: the suggestion existed before this request.
    """

    def __init__(self, typed: str, started: float, *, continuing: bool) -> None:
        self._typed = typed
        self._continuing = continuing
        self._shown = len(typed)  # characters of the suggestion covered by a partial
        self._last_at = started
        self._last_text: str | None = None

    def next(self, visible: str, now: float) -> str | None:
        """The partial to send for ``visible`` (the suggestion so far, typed text
        included) at time ``now``, or None."""
        if len(visible) <= self._shown or not visible.startswith(self._typed):
            return None
        grown = visible[self._shown :]
        line_done = "\n" in grown
        first_line = "\n" not in visible[len(self._typed) :]
        first_ready = self._last_text is None and self._continuing
        due = now - self._last_at >= EVERY_S
        if not (line_done or (first_line and (first_ready or due))):
            return None
        text = visible[len(self._typed) :]
        if not first_line:
            text = text[: text.rindex("\n")]  # whole lines only
        text = text.rstrip()
        if not text.strip() or text == self._last_text:
            return None
        self._shown = len(visible)
        self._last_at = now
        self._last_text = text
        return text
