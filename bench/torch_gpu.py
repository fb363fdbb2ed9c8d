"""Torch backend speed on a GPU: plain decoding against draft-model and n-gram speculation.

Random Qwen2 weights at realistic sizes (no download): the target has Qwen2.5-0.5B's
shape (~0.49B parameters), the draft is a ~0.1B Qwen2 (tied embeddings), bfloat16 on
CUDA, float32 on CPU. Everything runs through ``TorchBackend`` (detokenizing included),
greedy, on prompts of random words with a repeated stretch.

Random weights say nothing about acceptance: a random draft almost never agrees with a
random target, and random targets decode repetitively, which flatters n-gram lookup. So
the script prints three things: the measured forward cost of the target by rows and of
the draft (what matters on a GPU, where a batch of k rows costs about one row far longer
than on a CPU); the measured runs (tokens/s, tokens per target step, speedup: machinery
and overhead); and the speedup those costs *project* for per-token acceptance 0.5-0.9
(``E(k) / ((k * draft + target(k + 1)) / target(1))``, best k), the number to compare
with a real draft model's measured acceptance.

    python -m kode.bench.torch_gpu                      # CUDA, 0.5B target, 0.1B draft
    python -m kode.bench.torch_gpu --device cpu --small # smoke run (tiny models, seconds)
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from kode.backends.base import GenerationRequest, SpeculationMethod
from kode.backends.defaults import CONTEXT_SIZE
from kode.backends.local import DraftOptions
from kode.backends.speculative import CostCurve, expected_tokens
from kode.backends.torch.backend import TorchBackend
from kode.backends.torch.target import CausalLM
from tokenizers import Tokenizer, decoders, pre_tokenizers
from tokenizers import models as tok_models
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

METHODS = (
    SpeculationMethod.NONE,
    SpeculationMethod.DRAFT,
    SpeculationMethod.NGRAM,
    SpeculationMethod.AUTO,
)


@dataclass(frozen=True)
class Shape:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int


QWEN_05B = Shape(151_936, 896, 24, 14, 2, 4864)  # Qwen2.5-0.5B
DRAFT_01B = Shape(151_936, 512, 6, 8, 2, 1536)  # ~0.1B with tied embeddings
TINY = Shape(512, 64, 4, 4, 2, 128)
TINY_DRAFT = Shape(512, 32, 2, 4, 2, 64)


def random_qwen2(shape: Shape, seed: int, device: torch.device) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=shape.vocab,
        hidden_size=shape.hidden,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        intermediate_size=shape.intermediate,
        max_position_embeddings=CONTEXT_SIZE,
        tie_word_embeddings=True,
        eos_token_id=shape.vocab - 1,
    )
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.nn.Module.to(model, dtype=dtype)
    torch.nn.Module.eval(model)
    return model


def forward_ms(model: Qwen2ForCausalLM, sizes: Sequence[int], reps: int = 3) -> dict[int, float]:
    """Best-of-``reps`` time (ms) of one forward of n rows after a 256-token context."""
    lm = CausalLM(model)
    context = [i % lm.vocab_size for i in range(7, 7 + 256)]
    lm.forward(context, last_only=True)
    lm.forward(context[:1])  # warm-up
    ms = {}
    for n in sizes:
        best = float("inf")
        for _ in range(reps):
            lm.crop(len(context))
            lm.synchronize()
            t = time.perf_counter()
            lm.forward(context[:n])
            lm.synchronize()
            best = min(best, time.perf_counter() - t)
        ms[n] = best * 1000.0
    return ms


def projected(
    target_ms: dict[int, float], draft_ms: float, accept: float, max_k: int = 8
) -> tuple[tuple[int, float], tuple[int, float]]:
    """Best ``(k, speedup)`` for draft-model and for n-gram drafting (free drafts) at
    per-token acceptance ``accept``, from the measured costs."""
    curve = CostCurve(target_ms)
    base = target_ms[1]
    best_draft, best_ngram = (0, 1.0), (0, 1.0)
    for k in range(1, max_k + 1):
        verify = curve.cost(k + 1) * base
        tokens = expected_tokens(accept, k)
        best_draft = max(best_draft, (k, tokens * base / (k * draft_ms + verify)), key=_speed)
        best_ngram = max(best_ngram, (k, tokens * base / verify), key=_speed)
    return best_draft, best_ngram


def _speed(item: tuple[int, float]) -> float:
    return item[1]


def word_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """Token ``i`` is the word ``w<i>``; the last id is the end of text."""
    words = {f"w{i}": i for i in range(vocab - 1)} | {"<eos>": vocab - 1}
    tok = Tokenizer(tok_models.WordLevel(words, unk_token="<eos>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")  # type: ignore[no-untyped-call,unused-ignore]


def prompt_text(vocab: int, n: int, seed: int) -> str:
    """``n`` random words with a repeated stretch (something for n-gram lookup to find)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab - 1, (n // 2,), generator=g).tolist()
    ids = ids + ids[: n - len(ids)]
    return " ".join(f"w{i}" for i in ids)


@dataclass
class Row:
    method: str
    tokens: int
    ms_per_token: float
    tokens_per_step: float


async def measure(
    backend: TorchBackend, prompts: list[str], max_tokens: int, method: SpeculationMethod
) -> Row:
    tokens, ms, steps, produced = 0, 0.0, 0, 0
    for prompt in prompts:
        gen = await backend.generate(GenerationRequest(prompt, max_tokens, speculation=method))
        async for _ in gen:
            pass
        stats = await gen.wait()
        tokens += stats.completion_tokens
        ms += stats.total_ms - stats.ttft_ms
        spec = stats.speculation
        steps += spec.steps
        produced += spec.accepted + spec.steps
    per_token = ms / max(tokens - len(prompts), 1)
    return Row(str(method), tokens, per_token, produced / max(steps, 1))


async def main_async(args: argparse.Namespace) -> None:
    device = torch.device(args.device)
    shape, draft_shape = (TINY, TINY_DRAFT) if args.small else (QWEN_05B, DRAFT_01B)
    t = time.perf_counter()
    target = random_qwen2(shape, seed=0, device=device)
    draft = random_qwen2(draft_shape, seed=1, device=device)
    sizes = (1, 2, 4, 8, 16) if args.small else (1, 2, 4, 8, 16, 32)
    target_ms = forward_ms(target, sizes)
    draft_ms = forward_ms(draft, (1,))[1]
    print(
        f"device {device}, target {params(target):.1f}M params, draft {params(draft):.1f}M "
        f"params, built in {time.perf_counter() - t:.1f} s"
    )
    print(
        "target forward (ms) by rows: "
        + ", ".join(f"{n}: {ms:.2f}" for n, ms in target_ms.items())
        + f"; draft forward, 1 row: {draft_ms:.2f} ms"
    )
    backend = await TorchBackend.create(
        target,
        word_tokenizer(shape.vocab),
        draft=draft,
        draft_options=DraftOptions(max_draft=args.max_draft, p_min=args.p_min),
        curve=CostCurve(target_ms),
        n_ctx=CONTEXT_SIZE,
    )
    try:
        prompts = [prompt_text(shape.vocab, args.prompt_tokens, s) for s in range(args.prompts)]
        await measure(backend, prompts[:1], 8, SpeculationMethod.NONE)  # warm-up
        rows = [await measure(backend, prompts, args.tokens, m) for m in METHODS]
    finally:
        await backend.aclose()
    base = rows[0].ms_per_token
    print(f"\nmeasured: {args.prompts} prompts x {args.tokens} tokens, greedy")
    heads = ("method", "tokens", "ms/token", "tokens/s", "tok/step", "speedup")
    print(f"{heads[0]:<8} " + " ".join(f"{h:>9}" for h in heads[1:]))
    for r in rows:
        print(
            f"{r.method:<8} {r.tokens:>9} {r.ms_per_token:>9.2f} {1000 / r.ms_per_token:>9.1f} "
            f"{r.tokens_per_step:>9.2f} {base / r.ms_per_token:>8.2f}x"
        )
    print("\nprojected from the measured costs (best draft length k):")
    print(f"{'accept':<8} {'draft k':>9} {'draft':>9} {'ngram k':>9} {'ngram':>9}")
    for accept in (0.5, 0.7, 0.8, 0.9):
        (dk, ds), (nk, ns) = projected(target_ms, draft_ms, accept)
        print(f"{accept:<8} {dk:>9} {ds:>8.2f}x {nk:>9} {ns:>8.2f}x")


def params(model: Qwen2ForCausalLM) -> float:
    return sum(p.numel() for p in model.parameters()) / 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--small", action="store_true", help="tiny models (a CPU smoke run)")
    parser.add_argument("--max-draft", type=int, default=4)
    parser.add_argument("--p-min", type=float, default=0.0)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    args = parser.parse_args(argv)
    if args.small:
        args.tokens = min(args.tokens, 32)
        args.prompt_tokens = min(args.prompt_tokens, 64)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
