"""Token healing, the prompt side: what to take off the prompt, and off the answer.

With the cursor inside a word (``x = self.pro|``) the FIM prefix ends in a fragment
that the tokenizer cuts differently from the whole word, so the model sees a token it
rarely saw end a prefix. Kode ends the prefix at the start of its last token instead
(``x = self``) and asks the backend to begin the generation with the removed text
(``GenerationRequest.heal``; the constraint itself is ``backends/heal_index.py``). The
generation then spells ``.pro`` again (``.process(...)``), and the text shown is what
follows it. Only backends that can constrain tokens heal (``TokenHealing``: the local
engine); a remote server gets the prompt as it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable

# The cursor is inside a word: the character before it is a letter, digit or underscore.
_MID_WORD = re.compile(r"[A-Za-z0-9_]\Z")


def heal_text(line_prefix: str, last_token_chars: Callable[[str], int]) -> str:
    """The end of ``line_prefix`` to heal: its last token when the cursor follows a word
    character, else nothing. ``last_token_chars`` is the backend's tokenizer
    (``TokenHealing.last_token_chars``).

    Example: ``heal_text("x = self.pro", lambda text: 4) == ".pro"``;
    ``heal_text("print(", ...) == ""``.
    """
    if not _MID_WORD.search(line_prefix):
        return ""
    n = last_token_chars(line_prefix)
    return line_prefix[-n:] if 0 < n <= len(line_prefix) else ""


def after_heal(generated: str, heal: str) -> str:
    """The generated text after the healed part it begins with: what the cursor gets.
    Empty while the healed part is still being spelled, or if the generation did not
    spell it (the backend constrains it to, so that is a backend fault, shown as
    nothing rather than as a wrong fill).

    Example: ``after_heal(".process(x)", ".pro") == "cess(x)"``.
    """
    if not heal:
        return generated
    return generated[len(heal) :] if generated.startswith(heal) else ""
