"""Speculative edits on the real 0.5B model: the drafted rewrite is plain greedy decoding.

A chat prompt asks Qwen2.5-Coder-0.5B-Instruct to rename an identifier in a 14-line
function; the draft is the function's current text. The 0.5B renames the loop variable
and the parameter, so the draft is left and rejoined several times. Lossless is judged
token by token as in ``test_speculation_model.py``: a divergence is accepted only where
plain decoding's top-2 logit gap at the first differing token is below ``NEAR_TIE``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kode.backends import models
from kode.backends.base import FinishReason
from kode.backends.llama.rewrite import rewrite
from kode.backends.llama.runtime import LlamaContext, LlamaModel
from kode.backends.speculative import CostCurve
from kode.backends.speculative.edits import EDIT_CURVE_MS
from kode.bench.rewrite import top2_gap

pytestmark = [pytest.mark.model]

NEAR_TIE = 0.1
REGION = """def summarize(records, limit):
    total = 0
    count = 0
    for record in records:
        if record.amount is None:
            continue
        if count >= limit:
            break
        total += record.amount
        count += 1
        print(record.name, record.amount)
    if count == 0:
        return None
    return total / count
"""
PROMPT = (
    "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\n<|im_start|>user\nReplace `record` with `entry` in this code."
    f"\n\n```python\n{REGION}```<|im_end|>\n<|im_start|>assistant\n```python\n"
)
DRAFT = REGION + "```"
# Fixed: the sizing (and so the batches) must not depend on the machine's load.
CURVE = CostCurve(EDIT_CURVE_MS, fixed=True)


@pytest.fixture(scope="module")
def ctx() -> Iterator[LlamaContext]:
    model = LlamaModel(models.resolve("small"))
    context = LlamaContext(model, n_ctx=2048, n_seq_max=2)
    yield context
    context.close()
    model.close()


def test_drafted_rewrite_equals_plain_greedy(ctx: LlamaContext) -> None:
    plain = rewrite(ctx, PROMPT, "", CURVE, max_tokens=200, stop_texts=("```",))
    drafted = rewrite(ctx, PROMPT, DRAFT, CURVE, max_tokens=200, stop_texts=("```",))
    assert plain.finish is FinishReason.END and plain.speculation.drafted == 0
    assert "entry" in plain.text and plain.text != REGION  # the model did edit the region
    spec = drafted.speculation
    print(f"plain {len(plain.tokens)} tokens in {plain.speculation.steps + 1} batches; {spec}")
    assert spec.accepted > len(plain.tokens) // 2  # drafts must hit
    assert (spec.accepted + spec.steps) / spec.steps > 2.5  # tokens per batch
    if drafted.tokens != plain.tokens:
        pairs = zip(drafted.tokens, plain.tokens, strict=False)
        first = next(
            (i for i, (a, b) in enumerate(pairs) if a != b),
            min(len(drafted.tokens), len(plain.tokens)),
        )
        assert first < min(len(drafted.tokens), len(plain.tokens)), "one is a prefix"
        gap = top2_gap(ctx, PROMPT, plain.tokens[: first + 1])
        assert gap < NEAR_TIE, (first, gap)
        print(f"near-tie divergence at token {first} (gap {gap:.3f})")
    else:
        assert drafted.text == plain.text


def test_a_cancel_stops_the_rewrite_between_batches(ctx: LlamaContext) -> None:
    base = ctx.decode_calls

    def cancelled() -> bool:  # true once the prompt's batch and three more have run
        return ctx.decode_calls - base > 3

    out = rewrite(ctx, PROMPT, DRAFT, CURVE, max_tokens=200, cancelled=cancelled)
    assert out.finish is FinishReason.CANCELLED
    assert 1 <= out.speculation.steps <= 3  # a step cut at a near tie decodes twice
    assert not any(slot.busy for slot in ctx.slots)  # the slot was given back
    full = rewrite(ctx, PROMPT, DRAFT, CURVE, max_tokens=200, stop_texts=("```",))
    assert 0 < len(out.tokens) < len(full.tokens)
    assert out.tokens == full.tokens[: len(out.tokens)]
