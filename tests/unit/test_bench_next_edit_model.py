"""``bench/next_edit_model.py`` without a model: the prompt of each variant, the output
turned into a proposal and scored, and the confidence of the changed tokens, on a tiny
synthetic sequence."""

from __future__ import annotations

from kode.bench.next_edit_cases import cut_hunks
from kode.bench.next_edit_model import (
    CURSOR,
    FILE_SEP,
    build_prompt,
    changed,
    confidence,
    normalize,
    proposal,
    region_at,
)
from kode.bench.next_edits import Step, score, steps

OLD = """\
def area(w, h):
    return w * h


def volume(w, h, d):
    return w * h * d
"""
NEW = """\
def area(width, h):
    return width * h


def volume(w, h, d):
    return w * h * d
"""


def _cut() -> list[Step]:
    # hunk 1: the signature; hunk 2: the body (the next edit)
    return steps(OLD, cut_hunks(OLD, NEW, [(1, 1, 1, 1), (2, 1, 2, 1)]))


def test_sweep_prompt_blocks_in_order() -> None:
    first, second = _cut()
    doc = second.before
    region = region_at(doc, first.cursor)
    prompt = build_prompt("sweep", "geo.py", doc, region, [first], OLD)
    names = [block.split("\n", 1)[0] for block in prompt.split(FILE_SEP)[1:]]
    assert names == ["geo.py.diff", "original/geo.py", "current/geo.py", "updated/geo.py"]
    assert "original:\ndef area(w, h):\nupdated:\ndef area(width, h):\n" in prompt
    assert f"{FILE_SEP}original/geo.py\n{OLD}" in prompt
    assert f"{FILE_SEP}current/geo.py\n{doc}{FILE_SEP}updated/geo.py\n" in prompt
    assert prompt.endswith("updated/geo.py\n")


def test_cursor_prompt_marks_the_cursor_and_gives_a_unified_diff() -> None:
    first, second = _cut()
    doc = second.before
    region = region_at(doc, first.cursor)
    prompt = build_prompt("cursor", "geo.py", doc, region, [first], OLD)
    assert "@@ -1,1 +1,1 @@\n-def area(w, h):\n+def area(width, h):\n" in prompt
    assert f"def area(width{CURSOR}, h):\n" in prompt
    assert prompt.count(CURSOR) == 1
    assert prompt.endswith(f"{FILE_SEP}updated/geo.py\n")


def test_output_becomes_the_trimmed_edit_and_scores_exact() -> None:
    first, second = _cut()
    doc = second.before
    region = region_at(doc, first.cursor)
    now = doc[region.start : region.end]
    output = now.replace("return w * h\n", "return width * h\n", 1)
    text = normalize(now, output.rstrip("\n") + CURSOR)  # marker and line break mended
    assert text == output
    edit = proposal(region, doc, text)
    at = doc.index("w * h") + 1  # the common start "w" is trimmed
    assert edit == (at, at, "idth")
    judged = score(second, [first], edit)
    assert judged.exact and judged.location and not judged.reversal


def test_unchanged_output_shows_nothing_and_a_wrong_one_is_scored_wrong() -> None:
    first, second = _cut()
    doc = second.before
    region = region_at(doc, first.cursor)
    now = doc[region.start : region.end]
    assert proposal(region, doc, normalize(now, now + "\n\n")) is None
    wrong = proposal(region, doc, now.replace("w * h * d", "w * h * d * 2"))
    judged = score(second, [first], wrong)
    assert judged.shown and not judged.exact and not judged.location


def test_changed_and_confidence_of_the_changed_tokens() -> None:
    assert changed("ab\n", "ab\n") is None
    assert changed("x = 1\n", "x = 12\n") == (5, 5, 6)
    pieces = [b"x", b" =", b" 1", b"2", b"\n"]
    logprobs = [-0.01, -0.02, -0.3, -1.5, -0.05]
    # output bytes [5, 6): the token "2"
    assert confidence(pieces, logprobs, 5, 6) == (-1.5, -1.5)
    # a deletion at byte 3: the token holding it
    assert confidence(pieces, logprobs, 3, 3) == (-0.3, -0.3)
    low, mean = confidence(pieces, logprobs, 2, 6) or (0.0, 0.0)
    assert low == -1.5 and abs(mean - (-0.02 - 0.3 - 1.5) / 3) < 1e-9  # " =", " 1", "2"
    assert confidence([], [], 0, 1) is None


def test_chat_prompt_opens_the_answer_as_a_code_block() -> None:
    first, second = _cut()
    doc = second.before
    region = region_at(doc, first.cursor)
    prompt = build_prompt("chat", "geo.py", doc, region, [first], OLD)
    assert prompt.startswith("<|im_start|>system\n")
    assert "```diff\n--- a/geo.py\n+++ b/geo.py\n@@ -1,1 +1,1 @@\n" in prompt
    assert f"def area(width{CURSOR}, h):\n" in prompt
    assert prompt.endswith("<|im_start|>assistant\n```python\n")
