"""Speculative decoding as pure algorithms: no model, no runtime, token ids are ints.

    ngram.py      prompt lookup: continuations of the latest tokens found earlier on
    tree.py       merge drafts into a token tree; verify it against the target's choices
    lookahead.py  lookahead decoding planner (Jacobi window + n-gram pool), one batch a step
    draft.py      draft-model chains and the exact p/q rejection rule
    policy.py     whether and how far to speculate, from the measured batch-cost curve

The runtimes (llama.cpp, torch) build batches from these plans and feed back the target's
choices; everything here is exact (lossless) whatever the drafts contain.
"""

from __future__ import annotations

from kode.backends.speculative.draft import accept_reject, draft_chain, sample_index
from kode.backends.speculative.lookahead import (
    Lookahead,
    LookaheadPlan,
    LookaheadResult,
    LookaheadRow,
)
from kode.backends.speculative.ngram import NgramDrafter, index_ngrams, merge_distinct
from kode.backends.speculative.policy import (
    AcceptanceStats,
    AdaptivePolicy,
    CostCurve,
    CostTracker,
    expected_tokens,
)
from kode.backends.speculative.tree import (
    LazyPicks,
    TokenTree,
    Verification,
    accept_greedy,
    build_tree,
    verify,
)

__all__ = [
    "AcceptanceStats",
    "AdaptivePolicy",
    "CostCurve",
    "CostTracker",
    "LazyPicks",
    "Lookahead",
    "LookaheadPlan",
    "LookaheadResult",
    "LookaheadRow",
    "NgramDrafter",
    "TokenTree",
    "Verification",
    "accept_greedy",
    "accept_reject",
    "build_tree",
    "draft_chain",
    "expected_tokens",
    "index_ngrams",
    "merge_distinct",
    "sample_index",
    "verify",
]
