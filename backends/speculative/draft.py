"""Draft-model speculation: draft a chain with a small model, verify it with the target.

``draft_chain`` drafts greedily and stops early when the draft model is unsure (its top
probability below ``p_min``): the simplest form of EAGLE-2's adaptive draft length, and
what llama.cpp's ``common/speculative`` does. Verification is either sample-and-match
(``tree.accept_greedy`` / ``tree.verify``, exact for any sampler) or, when the draft was
*sampled* and its probabilities are known, the rejection rule of Leviathan et al. and
Chen et al. (``accept_reject``), which is exact too and accepts more::

    accept draft token x at position i with probability min(1, p_i(x) / q_i(x));
    at the first rejection, emit a token from norm(max(0, p_i - q_i)) and stop;
    if all k are accepted, emit a bonus token from p_k.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import numpy.typing as npt


def draft_chain(
    step: Callable[[int], tuple[int, float]], root: int, max_len: int, p_min: float
) -> list[int]:
    """Draft greedily from ``root`` until ``max_len`` tokens or an unsure draft model.

    ``step(token)`` feeds one token to the draft model and returns its argmax next token
    and that token's probability. A token whose probability is below ``p_min`` ends the
    draft and is not included. The last drafted token is never fed (the draft model's
    KV holds ``root, d1 .. d(k-1)`` afterwards).

    Shapes: -> [k], 0 <= k <= max_len; ``step`` is called at most max_len times.

    Example:
        >>> probs = {1: (2, 0.9), 2: (3, 0.8), 3: (4, 0.3)}
        >>> draft_chain(lambda t: probs[t], root=1, max_len=5, p_min=0.5)
        [2, 3]
    """
    out: list[int] = []
    token = root
    while len(out) < max_len:
        token, prob = step(token)
        if prob < p_min:
            break
        out.append(token)
    return out


def sample_index(weights: npt.NDArray[np.float64], rng: np.random.Generator) -> int:
    """Index drawn with probability proportional to ``weights`` (non-negative, sum > 0).

    Example:
        >>> sample_index(np.array([0.0, 1.0, 0.0]), np.random.default_rng(0))
        1
    """
    cdf = np.cumsum(weights)
    u = rng.random() * cdf[-1]
    return min(int(np.searchsorted(cdf, u, side="right")), len(cdf) - 1)


def accept_reject(
    draft_tokens: Sequence[int],
    q: npt.ArrayLike,
    p: npt.ArrayLike,
    rng: np.random.Generator,
) -> tuple[int, int]:
    """The exact p/q rejection rule for a sampled chain draft.

    ``draft_tokens[i]`` was sampled from the draft distribution ``q[i]``; ``p[i]`` is the
    target's distribution at the same position (after the root and ``draft_tokens[:i]``),
    and ``p[k]`` the one after the whole draft. Returns ``(accepted, next_token)``: the
    output is ``draft_tokens[:accepted] + [next_token]``, distributed exactly as sampling
    the target token by token.

    Shapes: draft_tokens [k], q [k, V], p [k + 1, V] (rows are probabilities).

    Example:
        >>> q = [[0.5, 0.5, 0.0]]
        >>> p = [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]  # the target never picks token 0
        >>> accept_reject([0], q, p, np.random.default_rng(0))  # rejected, resampled
        (0, 1)
        >>> accept_reject([1], q, p, np.random.default_rng(0))  # p >= q: accepted, bonus
        (1, 2)
    """
    q_arr = np.asarray(q, dtype=np.float64)
    p_arr = np.asarray(p, dtype=np.float64)
    k = len(draft_tokens)
    if q_arr.ndim != 2 or p_arr.ndim != 2 or q_arr.shape[0] != k or p_arr.shape[0] != k + 1:
        raise ValueError(f"need q [{k}, V] and p [{k + 1}, V], got {q_arr.shape}, {p_arr.shape}")
    if q_arr.shape[1] != p_arr.shape[1]:
        raise ValueError(f"vocabulary sizes differ: {q_arr.shape[1]} vs {p_arr.shape[1]}")
    for i, x in enumerate(draft_tokens):
        px, qx = p_arr[i, x], q_arr[i, x]
        if px >= qx or rng.random() * qx < px:  # accept with probability min(1, px / qx)
            continue
        residual = np.maximum(p_arr[i] - q_arr[i], 0.0)
        return i, sample_index(residual if residual.sum() > 0.0 else p_arr[i], rng)
    return k, sample_index(p_arr[k], rng)
