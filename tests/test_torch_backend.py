"""The torch backend: lossless speculation, cancellation, KV reuse, llama.cpp agreement.

Most tests run a tiny randomly initialised Qwen2 (vocabulary 64, 2 layers, hidden 32)
with a character tokenizer, built here with fixed seeds, so they need no model file:

- sampling: the joint distribution of the first two tokens that draft-model speculation
  (a second tiny model drafts, the p/q rule decides) produces is compared with the exact
  distribution of plain sampling (computed from the target's own probabilities) by a
  chi-square test; the same test must reject two deliberately wrong rules;
- greedy: every method reproduces plain greedy decoding (an independent loop without a
  KV cache) token for token;
- a cancelled generation stops within one step and leaves the backend usable.

The last test compares the real 0.5B through transformers (GGUF weights dequantized to
float32) with llama.cpp (the same GGUF, quantized kernels) and prints their agreement.
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from collections.abc import Iterator, Sequence

import numpy as np
import pytest
import torch
from kode.backends import models
from kode.backends.base import FinishReason, GenerationRequest, Sampling, SpeculationMethod
from kode.backends.errors import BackendError
from kode.backends.llama.backend import LlamaBackend
from kode.backends.local import DraftOptions
from kode.backends.speculative import CostCurve, accept_reject, sample_index
from kode.backends.steppers import AcceptRule, DraftModelStepper, Probs
from kode.backends.torch.backend import Detokenizer, TorchBackend
from kode.backends.torch.target import CausalLM, Picker, TorchDraft, TorchTarget
from tokenizers import Regex, Tokenizer, decoders, pre_tokenizers
from tokenizers import models as tok_models
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

CHARS = "abcdefghijklmnopqrstuvwxyz0123456789 \n()=:+-*/.,_[]{}'\"<>#!?;&|"  # 63 + <eos>
# Fixed, and kept fixed (never updated from timed calls): choices independent of load.
CURVE = CostCurve({1: 1.0, 2: 1.1, 4: 1.3, 8: 1.8}, fixed=True)
ALPHA = 1e-3  # significance of the chi-square tests
DRAFT_NOISE = 0.1  # relative to each weight tensor's spread
PROMPTS = [
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2,",
    "for i in range(10):\n    print(i)\n",
]


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """The tiny model is all Python overhead; on a busy 2-core machine two spinning torch
    threads make each forward 20x slower than one."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {"<eos>": 0, **{c: i + 1 for i, c in enumerate(CHARS)}}
    tok = Tokenizer(tok_models.WordLevel(vocab, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def tiny_model(seed: int) -> Qwen2ForCausalLM:
    """A random Qwen2; ``initializer_range`` 0.5 makes its distributions peaked (top
    probability ~0.5), so drafts are sometimes right and p and q differ visibly."""
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(CHARS) + 1,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=0.5,
        eos_token_id=0,
        bos_token_id=0,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config)
    torch.nn.Module.eval(model)
    return model


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def target() -> Qwen2ForCausalLM:
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def draft(target: Qwen2ForCausalLM) -> Qwen2ForCausalLM:
    """The target with noise on every weight: a draft that is often, not always, right
    (like a smaller model of the same family)."""
    model = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * DRAFT_NOISE * param.std())
    return model


def encode(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    ids: list[int] = tokenizer.encode(text, add_special_tokens=False)
    return ids


# -- sampling: the p/q rule is exact, wrong rules are caught -------------------------------


def chi_square(
    counts: Counter[tuple[int, ...]], expected: dict[tuple[int, ...], float]
) -> tuple[float, int, float]:
    """Chi-square goodness of fit: ``(statistic, degrees of freedom, p-value)``; cells
    expecting fewer than 5 samples are pooled into one."""
    n = sum(counts.values())
    observed, wanted = [], []
    pooled_o, pooled_e = 0.0, 0.0
    for cell, prob in expected.items():
        if prob * n >= 5.0:
            observed.append(float(counts[cell]))
            wanted.append(prob * n)
        else:
            pooled_o += counts[cell]
            pooled_e += prob * n
    observed.append(pooled_o)
    wanted.append(pooled_e)
    o, e = np.array(observed), np.array(wanted)
    stat = float(((o - e) ** 2 / e).sum())
    df = len(o) - 1
    p = torch.special.gammaincc(
        torch.tensor(df / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0, dtype=torch.float64)
    )
    return stat, df, float(p)


def exact_first_two(model: Qwen2ForCausalLM, prompt: list[int]) -> dict[tuple[int, ...], float]:
    """P(x1, x2 | prompt) = p(x1 | prompt) * p(x2 | prompt, x1), all x1 in one batch."""
    vocab = model.config.vocab_size
    ids = torch.tensor([[*prompt, x1] for x1 in range(vocab)])
    with torch.inference_mode():
        logits = model(input_ids=ids).logits.double()
    p1 = torch.softmax(logits[0, -2], dim=-1)  # [V] after the prompt
    p2 = torch.softmax(logits[:, -1], dim=-1)  # [V, V] row x1: after prompt + x1
    joint = (p1[:, None] * p2).numpy()
    return {(a, b): float(joint[a, b]) for a in range(vocab) for b in range(vocab)}


def sample_first_two(
    target: Qwen2ForCausalLM,
    draft: Qwen2ForCausalLM,
    prompt: list[int],
    rule: AcceptRule,
    n: int,
    seed: int,
) -> tuple[Counter[tuple[int, ...]], float]:
    """First two tokens after ``prompt`` from the backend's draft-model stepper, ``n`` times;
    also the mean tokens per target step."""
    lm, small = CausalLM(target), CausalLM(draft)
    picker = Picker(Sampling(temperature=1.0, seed=seed))
    stepper = DraftModelStepper(
        TorchTarget(lm, picker), TorchDraft(small, picker), max_draft=2, p_min=0.0, rule=rule
    )
    lm.prefill(prompt[:-1])
    counts: Counter[tuple[int, ...]] = Counter()
    for _ in range(n):
        lm.crop(len(prompt) - 1)  # the stepper evaluates the root itself
        out: list[int] = []
        root = prompt[-1]
        while len(out) < 2:
            new = stepper.step(root)
            out.extend(new)
            root = new[-1]
        counts[tuple(out[:2])] += 1
    return counts, stepper.stats.accepted_mean


def resample_from_target(
    draft_tokens: Sequence[int], q: Probs, p: Probs, rng: np.random.Generator
) -> tuple[int, int]:
    """WRONG: accepts with min(1, p/q) but resamples a rejection from p, not from the
    residual norm(max(0, p - q)), so tokens the draft likes are over-represented."""
    for i, x in enumerate(draft_tokens):
        if p[i, x] >= q[i, x] or rng.random() * q[i, x] < p[i, x]:
            continue
        return i, sample_index(p[i], rng)
    return len(draft_tokens), sample_index(p[len(draft_tokens)], rng)


def always_accept(
    draft_tokens: Sequence[int], q: Probs, p: Probs, rng: np.random.Generator
) -> tuple[int, int]:
    """WRONG: keeps every draft token (the output follows the draft model)."""
    return len(draft_tokens), sample_index(p[len(draft_tokens)], rng)


def test_pq_rule_matches_plain_sampling_and_wrong_rules_are_rejected(
    target: Qwen2ForCausalLM,
    draft: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prompt = encode(tokenizer, "def f(x):\n    return")
    expected = exact_first_two(target, prompt)
    rules: list[tuple[str, AcceptRule, int]] = [
        ("p/q rule (accept_reject)", accept_reject, 1500),
        ("wrong: resample from p", resample_from_target, 1500),
        ("wrong: always accept", always_accept, 500),  # far off: few samples suffice
    ]
    lines, p_values, means = [], [], []
    for name, rule, n in rules:
        counts, mean = sample_first_two(target, draft, prompt, rule, n, seed=7)
        stat, df, p = chi_square(counts, expected)
        lines.append(
            f"  {name}: {n} samples, chi2={stat:.1f}, df={df}, p={p:.3g}, tokens/step={mean:.2f}"
        )
        p_values.append(p)
        means.append(mean)
    report = "\n".join(lines)
    with capsys.disabled():
        print(f"\njoint distribution of the first two sampled tokens vs exact:\n{report}")
    assert p_values[0] > ALPHA, report
    assert p_values[1] < ALPHA and p_values[2] < ALPHA, report
    assert means[0] > 1.3, report  # drafts are accepted often enough to matter


# -- greedy: every method equals plain decoding ------------------------------------------


def plain_greedy(model: Qwen2ForCausalLM, prompt: list[int], n: int) -> list[int]:
    """Reference: argmax decoding recomputing the whole sequence each step (no KV cache)."""
    ids, out = list(prompt), []
    with torch.inference_mode():
        for _ in range(n):
            token = int(torch.argmax(model(input_ids=torch.tensor([ids])).logits[0, -1]))
            if token == 0:  # <eos>
                break
            out.append(token)
            ids.append(token)
    return out


async def run(
    backend: TorchBackend, prompt: str, n: int, method: SpeculationMethod
) -> tuple[list[int], str, GenerationRequest]:
    request = GenerationRequest(prompt, n, speculation=method)
    gen = await backend.generate(request)
    tokens: list[int] = []
    text = ""
    async for chunk in gen:
        tokens.extend(chunk.token_ids)
        text += chunk.text
    await gen.wait()
    return tokens, text, request


@pytest.mark.parametrize(
    "method",
    [
        SpeculationMethod.NONE,
        SpeculationMethod.NGRAM,
        SpeculationMethod.AUTO,
        SpeculationMethod.DRAFT,
    ],
)
async def test_greedy_equals_plain_decoding(
    method: SpeculationMethod,
    target: Qwen2ForCausalLM,
    draft: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    backend = await TorchBackend.create(
        target, tokenizer, draft=draft, draft_options=DraftOptions(p_min=0.0), curve=CURVE
    )
    try:
        drafted = accepted = 0
        for prompt in PROMPTS:
            want = plain_greedy(target, encode(tokenizer, prompt), 40)
            got, text, _ = await run(backend, prompt, 40, method)
            assert got == want, f"{method} on {prompt!r}"
            assert text == tokenizer.decode(want)
            spec = backend.counters.last.speculation
            drafted += spec.drafted
            accepted += spec.accepted
        if method is not SpeculationMethod.NONE:
            assert drafted > 0 and accepted > 0, (drafted, accepted)
    finally:
        await backend.aclose()


@pytest.mark.parametrize("method", [SpeculationMethod.NGRAM, SpeculationMethod.AUTO])
async def test_sample_and_match_reproduces_plain_sampling_seed_for_seed(
    method: SpeculationMethod, target: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast
) -> None:
    """n-gram drafts are verified by sampling the target at each row in order, so the
    random generator sees exactly plain sampling's draws: same seed, same tokens."""
    backend = await TorchBackend.create(target, tokenizer, curve=CURVE)
    try:
        sampling = Sampling(temperature=0.8, top_p=0.9, seed=11)
        for prompt in PROMPTS:
            outputs = []
            for m in (SpeculationMethod.NONE, method):
                gen = await backend.generate(GenerationRequest(prompt, 40, sampling, m))
                outputs.append([t async for chunk in gen for t in chunk.token_ids])
            assert outputs[0] == outputs[1], prompt
        assert backend.counters.last.speculation.drafted > 0
    finally:
        await backend.aclose()


async def test_draft_model_equal_to_target_is_always_accepted(
    target: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast
) -> None:
    """A drafter that cannot miss: the target as its own draft. Guards against a silently
    broken drafter (mean tokens per step must approach max_draft + 1)."""
    opts = DraftOptions(max_draft=4, p_min=0.0)
    backend = await TorchBackend.create(
        target, tokenizer, draft=target, draft_options=opts, curve=CURVE
    )
    try:
        want = plain_greedy(target, encode(tokenizer, PROMPTS[0]), 40)
        got, _, _ = await run(backend, PROMPTS[0], 40, SpeculationMethod.DRAFT)
        assert got == want
        spec = backend.counters.last.speculation
        assert spec.accepted == spec.drafted
        assert spec.accepted_mean > 4.0, spec
    finally:
        await backend.aclose()


async def test_lookahead_is_refused_clearly(
    target: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast
) -> None:
    backend = await TorchBackend.create(target, tokenizer, curve=CURVE)
    try:
        with pytest.raises(BackendError, match=r"llama\.cpp-only"):
            await backend.generate(
                GenerationRequest("x", 4, speculation=SpeculationMethod.LOOKAHEAD)
            )
        with pytest.raises(BackendError, match="draft model"):
            await backend.generate(GenerationRequest("x", 4, speculation=SpeculationMethod.DRAFT))
    finally:
        await backend.aclose()


async def test_kv_prefix_is_reused_across_requests(
    target: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast
) -> None:
    backend = await TorchBackend.create(target, tokenizer, curve=CURVE)
    try:
        first = PROMPTS[0]
        await run(backend, first, 8, SpeculationMethod.NONE)
        edited = first + "    return a * b\n"  # typing after the cursor: an extension
        got, _, _ = await run(backend, edited, 12, SpeculationMethod.NGRAM)
        stats = backend.counters.last
        assert stats.reused_prompt_tokens == len(encode(tokenizer, first))
        assert stats.evaluated_prompt_tokens == len(encode(tokenizer, edited)) - len(
            encode(tokenizer, first)
        )
        assert got == plain_greedy(target, encode(tokenizer, edited), 12)
        shorter = first[:-10]  # deleting text: the cache is cropped, not rebuilt
        got, _, _ = await run(backend, shorter, 12, SpeculationMethod.NONE)
        assert backend.counters.last.reused_prompt_tokens == len(encode(tokenizer, shorter)) - 1
        assert got == plain_greedy(target, encode(tokenizer, shorter), 12)
    finally:
        await backend.aclose()


# -- cancellation --------------------------------------------------------------------------


@pytest.mark.parametrize("method", [SpeculationMethod.NONE, SpeculationMethod.DRAFT])
async def test_cancel_stops_within_one_step(
    method: SpeculationMethod,
    target: Qwen2ForCausalLM,
    draft: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    backend = await TorchBackend.create(target, tokenizer, draft=draft, curve=CURVE, n_ctx=1024)
    try:
        sampling = Sampling(temperature=1.0, seed=3)  # no <eos> loop can end it early
        gen = await backend.generate(GenerationRequest(PROMPTS[0], 600, sampling, method))
        seen = 0
        async for _chunk in gen:
            seen += 1
            if seen == 3:
                break  # leaving the loop cancels, as cancel() does
        await gen.cancel()
        stats = gen.stats
        assert stats.finish_reason is FinishReason.CANCELLED
        assert stats.steps_after_cancel <= 1
        assert stats.completion_tokens < 600
        steps = backend.counters.generation_steps
        # Cancelled before the first step: nothing after the prefill.
        gen = await backend.generate(GenerationRequest(PROMPTS[1], 600, sampling, method))
        await gen.cancel()
        assert gen.stats.finish_reason is FinishReason.CANCELLED
        assert gen.stats.decode_steps <= 1
        assert backend.counters.generation_steps - steps <= 1
        # The backend is free and its cache consistent.
        got, _, _ = await asyncio.wait_for(
            run(backend, PROMPTS[1], 10, SpeculationMethod.NONE), timeout=30
        )
        assert got == plain_greedy(target, encode(tokenizer, PROMPTS[1]), 10)
        assert backend.counters.cancelled == 2
    finally:
        await backend.aclose()


# -- the real 0.5B: transformers (dequantized) against llama.cpp (quantized) ---------------

REAL_PROMPTS = [
    "<|fim_prefix|>def fibonacci(n):\n    <|fim_suffix|>\n\nprint(fibonacci(10))\n<|fim_middle|>",
    "<|fim_prefix|>COLORS = {\n    'red': (255, 0, 0),\n    'green': (0, 255, 0),\n"
    "<|fim_suffix|>\n}\n<|fim_middle|>",
    "<|fim_prefix|>import os\n\n\ndef list_python_files(root):\n<|fim_suffix|>\n<|fim_middle|>",
]


@pytest.mark.model
@pytest.mark.slow
async def test_agreement_with_llama_cpp_on_the_real_model(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Greedy on both engines from the same GGUF: llama.cpp computes with quantized kernels,
    transformers with the dequantized weights in float32, so near ties may flip. Reported:
    identical leading tokens, positions equal, and both engines' top-2 logit gaps at a
    first divergence. Where they pick different tokens, their logit differences between
    the two tokens differ by at least the sum of the two top-2 gaps; required: that sum is
    below ``CLOSE_CALL`` (a near tie, not a tokenizer, position or weight-loading bug), and
    n-gram speculation on transformers equals its own plain decoding.
    """
    small = models.resolve("small")
    n = 24
    # One thread each: on a busy 2-core machine two spinning threads are far slower.
    llama = await LlamaBackend.load(small, n_ctx=1024, n_threads=1, curve=CURVE)
    try:
        backend = await TorchBackend.load(str(small), device="cpu", n_ctx=1024, curve=CURVE)
        try:
            lines, prefix, equal, total, worst = [], 0, 0, 0, 0.0
            for prompt in REAL_PROMPTS:
                want = await run_llama(llama, prompt, n)
                got, _, _ = await run(backend, prompt, n, SpeculationMethod.NONE)
                d = first_divergence(got, want)
                length = max(len(got), len(want))
                prefix += length if d is None else d
                equal += sum(a == b for a, b in zip(got, want, strict=False))
                total += length
                where = "none"
                if d is not None:
                    t_gap = (await backend.logit_gaps(prompt, got[: d + 1]))[d]
                    l_gap = (await llama.logit_gaps(prompt, want[: d + 1]))[d]
                    worst = max(worst, t_gap + l_gap)
                    where = f"at token {d} (top-2 gap: torch {t_gap:.3f}, llama.cpp {l_gap:.3f})"
                lines.append(f"  {prompt[:40]!r}: first divergence {where}")
            plain, _, _ = await run(backend, REAL_PROMPTS[1], n, SpeculationMethod.NONE)
            spec, _, _ = await run(backend, REAL_PROMPTS[1], n, SpeculationMethod.NGRAM)
            # Streaming text: byte-level tokens that split a character are held back.
            text = "naïve café → 😀 中文\n"
            detok = Detokenizer(backend.vocab)
            pieces = [detok.push(t) for t in backend.vocab.tokenize(text)]
            assert "".join(pieces) + detok.flush() == text
            assert all("\ufffd" not in piece for piece in pieces)
        finally:
            await backend.aclose()
    finally:
        await llama.aclose()
    with capsys.disabled():
        print(
            f"\ntorch fp32 (dequantized GGUF) vs llama.cpp (quantized GGUF), greedy, "
            f"{len(REAL_PROMPTS)} prompts x {n} tokens: identical leading tokens "
            f"{prefix}/{total}, positions equal {equal}/{total}"
        )
        print("\n".join(lines))
    assert worst < CLOSE_CALL, lines
    assert spec == plain


CLOSE_CALL = 1.0  # logits; quantized vs float32 kernels move logits by a few tenths


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """First index where ``a`` and ``b`` differ (a length difference counts), else None."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


async def run_llama(backend: LlamaBackend, prompt: str, n: int) -> list[int]:
    gen = await backend.generate(GenerationRequest(prompt, n, speculation=SpeculationMethod.NONE))
    tokens: list[int] = []
    async for chunk in gen:
        tokens.extend(chunk.token_ids)
    await gen.wait()
    return tokens
