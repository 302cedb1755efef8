"""A long-tailed rollout batch, continuous vs static batching: total wall time and generated
tokens/s of N requests whose response lengths spread as RL's do (most short, a few at the budget).

Response lengths: lognormal, length = clip(round(exp(mu + sigma * z)), 1, budget) with z standard
normal, mu = log(budget * median_frac) (the median length is median_frac of the budget) and
sigma = --sigma; EOS is forced at the drawn length through per-request max_new_tokens (the model
is random: its own EOS would fall anywhere). Prompts: 4-16 random tokens.

- continuous: ONE `generate` over all N requests: up to max_batch run at once, a finished
  request's slot is refilled at once with the next waiting one (prefilled alone into that slot).
- static: the same requests in chunks of max_batch, one `generate` each: a chunk runs until its
  longest request ends (finished rows idle, nothing refills them).
With minite's batch-invariant kernels (strict, bf16) both give every request the same tokens and
log-probs, bit for bit (checked every run, the table's last column); the stock-kernel engine is
not batch-invariant, so its column may say NO.

Token steps (a request's first token comes from its prefill, the rest from decode steps):
static runs the sum over chunks of the longest length; continuous at best total tokens /
max_batch (every slot busy every step). The ideal ratio static / continuous is their quotient,
prefills free. Wall time also pays the prefills (continuous: one
batch-1 prefill per admitted request; static: one batched prefill per chunk) and host syncs.

Every figure after one warm-up run of each mode (compiles). CPU, tiny Qwen3 (hidden 64); GPU,
a real shape from `fp4_compile.models.REAL_SHAPES` at --layers, full vocabulary
(`PARTS=long_tail` of benchmarks/gpu_session.sh):

    python -m benchmarks.rollout_long_tail [--requests 64] [--max-batch 8] [--budget 64]
        [--median-frac 0.125] [--sigma 1.0] [--configs strict,bf16,stock] [--layers 2]
        [--model tiny-qwen3 | qwen3-8b | qwen3-30b-a3b] [--device cpu | cuda]
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.models import REAL_SHAPES, TINY, build_causal_lm
from fp4_compile.rollout import RolloutEngine

CONFIGS = {
    "strict": ("minite strict NVFP4", {"recipe": NVFP4Recipe.strict()}),
    "bf16": ("minite bf16 recipe", {"recipe": NVFP4Recipe.bf16()}),
    "stock": ("same engine, stock kernels", {"compile": False}),
}


def long_tail_lengths(num: int, budget: int, *, median_frac: float, sigma: float, seed: int):
    """num response lengths in [1, budget]: lognormal (median budget * median_frac), capped."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(num, generator=g, dtype=torch.float64)
    drawn = torch.exp(math.log(budget * median_frac) + sigma * z).round()
    return drawn.clamp(1, budget).long().tolist()


def make_prompts(num: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed + 1)
    lengths = torch.randint(4, 17, (num,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def run_continuous(engine, prompts, lengths, seeds):
    return engine.generate(prompts, max_new_tokens=lengths, seed=seeds)


def run_static(engine, prompts, lengths, seeds):
    """Chunks of max_batch requests, one generate each (the chunk runs to its longest)."""
    tokens, logprobs = [], []
    for s in range(0, len(prompts), engine.max_batch):
        chunk = slice(s, s + engine.max_batch)
        out = engine.generate(prompts[chunk], max_new_tokens=lengths[chunk], seed=seeds[chunk])
        tokens += out.tokens
        logprobs += out.logprobs
    return tokens, logprobs


def measure(engine, prompts, lengths, seeds, reps: int) -> dict:
    """Warm-up (compiles) then `reps` timed runs of each mode, alternating; the bitwise check."""
    cont = run_continuous(engine, prompts, lengths, seeds)
    static = run_static(engine, prompts, lengths, seeds)
    same = cont.tokens == static[0] and all(
        torch.equal(a.view(torch.int32), b.view(torch.int32))
        for a, b in zip(cont.logprobs, static[1])
    )
    walls = {"continuous": [], "static": []}
    steps = {}
    for _ in range(reps):
        for mode, fn in (("continuous", run_continuous), ("static", run_static)):
            before = engine.decode_steps
            t0 = time.perf_counter()
            fn(engine, prompts, lengths, seeds)
            walls[mode].append(time.perf_counter() - t0)
            steps[mode] = engine.decode_steps - before
    total = sum(lengths)
    wall = {m: min(w) for m, w in walls.items()}
    return {
        "bitwise_equal": same,
        "wall_s": wall,
        "wall_s_all": walls,
        "decode_steps": steps,
        "tokens_per_s": {m: total / w for m, w in wall.items()},
        "speedup": wall["static"] / wall["continuous"],
        "step_ratio": steps["static"] / max(steps["continuous"], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--budget", type=int, default=64, help="max_new_tokens cap")
    parser.add_argument("--median-frac", type=float, default=0.125)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--configs", default="strict", help="comma-separated: " + ",".join(CONFIGS))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--model", default="tiny-qwen3", choices=sorted(TINY) + sorted(REAL_SHAPES))
    parser.add_argument("--device", default="cpu", help="cpu, or cuda")
    parser.add_argument("--reps", type=int, default=2, help="timed runs per mode (min taken)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    from benchmarks.common import environment, write_results

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    dtype = torch.float32 if args.model in TINY else torch.bfloat16  # tiny: as the CPU tests
    model = build_causal_lm(args.model, layers=args.layers, dtype=dtype, device=device).eval()
    vocab = model.config.vocab_size
    lengths = long_tail_lengths(
        args.requests, args.budget, median_frac=args.median_frac, sigma=args.sigma, seed=args.seed
    )
    prompts = make_prompts(args.requests, vocab, args.seed)
    seeds = list(range(1000, 1000 + args.requests))
    total = sum(lengths)
    static_ideal = sum(
        max(lengths[s : s + args.max_batch]) for s in range(0, args.requests, args.max_batch)
    )
    ideal_steps = total / args.max_batch
    dist = {
        "total_tokens": total,
        "mean": total / args.requests,
        "median": sorted(lengths)[args.requests // 2],
        "max": max(lengths),
        "at_budget": sum(n == args.budget for n in lengths),
        "static_token_slots": static_ideal * args.max_batch,
        "ideal_ratio": static_ideal / ideal_steps,
    }
    rows = {}
    max_seq_len = 16 + args.budget
    for name in args.configs.split(","):
        label, kw = CONFIGS[name]
        torch._dynamo.reset()
        engine = RolloutEngine(
            model, max_batch=args.max_batch, max_seq_len=max_seq_len, device=device, **kw
        )
        rows[label] = measure(engine, prompts, lengths, seeds, args.reps)
        print(label, rows[label], flush=True)
    env = environment()
    lines = [
        f"# Long-tail rollout, continuous vs static batching ({env['gpu']})",
        "",
        f"{args.model} ({args.layers} layers, vocabulary {vocab}), {args.requests} "
        f"requests, max_batch {args.max_batch}, budget {args.budget} new tokens; torch "
        f"{env['torch']}, commit {env['commit']}, {env['date']}.",
        "",
        f"Response lengths: lognormal, median {args.median_frac} x budget, sigma {args.sigma}, "
        f"capped at the budget (EOS forced there through per-request max_new_tokens): total "
        f"{total} tokens, mean {dist['mean']:.1f}, median {dist['median']}, max {dist['max']}, "
        f"{dist['at_budget']} at the budget.",
        "",
        f"Ideal ratio static / continuous = static token steps / (total tokens / max_batch) = "
        f"{static_ideal} / {ideal_steps:.1f} = **{dist['ideal_ratio']:.2f}x** (static token "
        "steps: the sum over chunks of the longest length; continuous at best keeps every slot "
        "busy every step; prefills and host syncs not counted).",
        "",
        "| engine | continuous s | static s | continuous tok/s | static tok/s | speedup "
        "(static / continuous) | decode steps cont. / static | bitwise equal |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, r in rows.items():
        w, tps, st = r["wall_s"], r["tokens_per_s"], r["decode_steps"]
        lines.append(
            f"| {label} | {w['continuous']:.2f} | {w['static']:.2f} | {tps['continuous']:.1f} | "
            f"{tps['static']:.1f} | **{r['speedup']:.2f}x** | {st['continuous']} / "
            f"{st['static']} | {'yes' if r['bitwise_equal'] else 'NO'} |"
        )
    lines += [
        "",
        "Wall times: the minimum of the timed runs, after one warm-up run of each mode. Decode "
        "steps: calls of the decode program (continuous also runs one batch-1 prefill per "
        "request admitted after the first max_batch).",
    ]
    print("\n".join(lines))
    payload = {
        "env": env,
        "args": vars(args),
        "lengths": lengths,
        "distribution": dist,
        "rows": rows,
    }
    if not args.no_write:
        topic = f"rollout_long_tail_{args.device.split(':')[0]}"
        for path in write_results(topic, payload, "\n".join(lines) + "\n"):
            print("wrote", path)


if __name__ == "__main__":
    main()
