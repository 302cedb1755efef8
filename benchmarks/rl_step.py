"""One GRPO step, per phase (issue 54): the rollout of a long-tailed batch, the learner's forward +
backward over it, the optimizer step, the weight sync into the engine. The number users ask
first: how much faster is my RL step.

Pairings (one process, the engine shares the learner's module, as `minite train` runs):
- strict: minite strict NVFP4 rollout engine + the minite-compiled strict learner (the same
  lowering: learner == rollout log-probs, bit for bit; checked every run);
- bf16: the minite bf16 recipe on both sides (same engine and invariant kernels, no quantization);
- stock: what a user would otherwise run: the engine on stock kernels (no minite lowering) for
  the rollout, an Inductor-compiled BF16 learner, and truncated importance sampling (TIS, cap 2)
  on the mismatch the two leave.
The batch: `--prompts` x `--group` requests, prompts of `--prompt` random tokens, response
lengths drawn as `benchmarks.rollout_long_tail` draws them (lognormal, median
`--median-frac` x budget, sigma `--sigma`, capped at `--budget`; EOS forced at the drawn length
by per-request budgets), ONE `generate` over all of them (continuous batching, `--max-batch` at
once). Loss: the GRPO clipped surrogate (`fp4_compile.rl` policy_loss), group-normalized random
rewards. Optimizer: AdamW (FP32 states) on the learner's parameters.

Every phase is timed with the device synchronized at its ends; the first step compiles and is
reported apart, the rest are medians over `--steps`. On a CPU at a tiny shape (the default) the
ratios between pairings are only the CPU's; the GPU part runs it at the real shapes:

    python -m benchmarks.rl_step [--model tiny-qwen3|qwen3-8b|qwen3-30b-a3b] [--layers 2]
        [--prompts 8] [--group 4] [--prompt 16] [--budget 32] [--max-batch 16] [--steps 2]
        [--configs strict,bf16,stock]
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import environment, median, write_results
from benchmarks.rollout_long_tail import long_tail_lengths
from fp4_compile import NVFP4Recipe
from fp4_compile.models import build_causal_lm
from fp4_compile.rl.train.grpo import group_advantages, policy_loss, rollout_correction
from fp4_compile.rollout import RolloutEngine, sequence_logprobs

PAIRINGS = {
    "strict": {"recipe": NVFP4Recipe.strict(), "tis_cap": None},
    "bf16": {"recipe": NVFP4Recipe.bf16(), "tis_cap": None},
    "stock": {"recipe": None, "tis_cap": 2.0},
}
PHASES = ("rollout", "learner", "optimizer", "weight_sync")


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    def __init__(self, device):
        self.device, self.phases = device, {}

    def __call__(self, name, fn):
        _sync(self.device)
        t0 = time.perf_counter()
        out = fn()
        _sync(self.device)
        self.phases[name] = time.perf_counter() - t0
        return out


def build(pairing: str, args, device):
    """(learner module, compiled learner, engine) of one pairing."""
    model = build_causal_lm(args.model, layers=args.layers, device=device).train()
    recipe = PAIRINGS[pairing]["recipe"]
    graphs = device.type == "cuda"
    common = dict(max_batch=args.max_batch, max_seq_len=args.prompt + args.budget)
    if recipe is None:
        learner = torch.compile(model)  # Inductor BF16
        engine = RolloutEngine(model, compile=False, cuda_graphs=graphs, **common)
    else:
        learner = torch.compile(model, backend="minite", options={"recipe": recipe})
        engine = RolloutEngine(model, recipe=recipe, cuda_graphs=graphs, **common)
    return model, learner, engine


def one_step(step: int, model, learner, engine, optimizer, batch, args, device) -> dict:
    prompts, lengths = batch
    seeds = [step * 100_003 + i for i in range(len(prompts))]
    timer = Timer(device)
    out = timer("rollout", lambda: engine.generate(prompts, max_new_tokens=lengths, seed=seeds))
    sequences = [p + t for p, t in zip(prompts, out.tokens)]
    prompt_lens = [len(p) for p in prompts]
    g = torch.Generator().manual_seed(step)
    rewards = torch.rand(len(prompts), generator=g).to(device)
    adv = group_advantages(rewards, group_size=args.group, scale="std")

    def learn():
        logp = sequence_logprobs(learner, sequences, prompt_lens, device=device)
        width = max(len(x) for x in logp)
        pad = lambda xs: torch.stack([torch.nn.functional.pad(x, (0, width - len(x))) for x in xs])  # noqa: E731
        mask = pad([torch.ones_like(x) for x in logp])
        new, old = pad(logp), pad([x.detach() for x in logp])
        rollout = pad([x.to(device) for x in out.logprobs])
        cap = PAIRINGS[args.current]["tis_cap"]
        is_weight, keep, _ = rollout_correction(old, rollout, mask, tis_cap=cap)
        loss, _ = policy_loss(
            new, old, adv, keep, clip_low=0.2, clip_high=0.28, is_weight=is_weight
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        same = (old.view(torch.int32) == rollout.view(torch.int32)).all(dim=1)  # bit for bit
        return int(same.sum())

    equal_rows = timer("learner", learn)
    timer("optimizer", optimizer.step)
    timer("weight_sync", lambda: engine.update_weights(model))
    tokens = sum(len(t) for t in out.tokens)
    return {"s": timer.phases, "generated_tokens": tokens, "learner_eq_rollout_rows": equal_rows}


def run_pairing(pairing: str, args, device, batch) -> dict:
    torch._dynamo.reset()
    args.current = pairing
    model, learner, engine = build(pairing, args, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    steps = [
        one_step(s, model, learner, engine, optimizer, batch, args, device)
        for s in range(args.steps + 1)
    ]
    warm = steps[1:]
    result = {
        "first_step_s": steps[0]["s"],
        "phase_s": {p: median([s["s"][p] for s in warm]) for p in PHASES},
        "generated_tokens": warm[-1]["generated_tokens"],
        "learner_eq_rollout_rows": [s["learner_eq_rollout_rows"] for s in steps],
        "requests": len(batch[0]),
    }
    result["step_s"] = sum(result["phase_s"].values())
    del model, learner, engine, optimizer
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return result


def report(results: dict, args, env: dict) -> str:
    base = results.get("stock")
    lines = [
        f"# One GRPO step per phase, {env['gpu']}, emulated NVFP4 (sm_90) where on Hopper, torch "
        f"{env['torch']}, triton {env['triton']}, commit {env['commit']}",
        "",
        f"{args.model}, {args.layers} layers; {args.prompts} prompts x {args.group} = "
        f"{args.prompts * args.group} requests, prompt {args.prompt} tokens, responses lognormal "
        f"(median {args.median_frac} x budget {args.budget}, sigma {args.sigma}, capped), "
        f"max_batch {args.max_batch}; medians of {args.steps} steps after the first.",
        "",
        "| pairing | rollout s | learner fwd+bwd s | optimizer s | weight sync s | step s "
        "| vs stock | rollout tok/s | learner == rollout rows | first step s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, r in results.items():
        p = r["phase_s"]
        ratio = f"{base['step_s'] / r['step_s']:.2f}x" if base else "-"
        eq = f"{r['learner_eq_rollout_rows'][-1]} / {r['requests']}"
        lines.append(
            f"| {name} | {p['rollout']:.3f} | {p['learner']:.3f} | {p['optimizer']:.3f} | "
            f"{p['weight_sync']:.3f} | {r['step_s']:.3f} | {ratio} | "
            f"{r['generated_tokens'] / p['rollout']:.0f} | {eq} | {sum(r['first_step_s'].values()):.1f} |"
        )
    lines.append(
        "\nvs stock: the stock pairing's step time / this one's (> 1: faster). learner == rollout "
        "rows: requests whose learner log-probs equal the engine's bit for bit (strict and bf16 "
        "must be all; stock is not batch-invariant nor the same numerics)."
    )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="tiny-qwen3")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--budget", type=int, default=32)
    parser.add_argument("--median-frac", type=float, default=0.125)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--configs", default="strict,bf16,stock")
    parser.add_argument("--name", default="", help="results file stem (default rl_step_<model>)")
    args = parser.parse_args()
    configs = args.configs.split(",")
    unknown = [c for c in configs if c not in PAIRINGS]
    if unknown or args.steps < 1 or args.group < 2 or args.prompt < 1 or args.budget < 1:
        raise ValueError(
            f"--configs must name {list(PAIRINGS)} (unknown: {unknown}); --steps >= 1, "
            "--group >= 2, --prompt and --budget >= 1"
        )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    env = environment()
    num = args.prompts * args.group
    vocab = build_causal_lm(args.model, layers=1, device="meta").config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, vocab, (args.prompt,), generator=g).tolist() for _ in range(num)]
    lengths = long_tail_lengths(
        num, args.budget, median_frac=args.median_frac, sigma=args.sigma, seed=0
    )
    results = {}
    name = args.name or f"rl_step_{args.model.replace('-', '_')}_{device.type}"
    for pairing in configs:  # results rewritten after each pairing: a cut-off run keeps them
        results[pairing] = run_pairing(pairing, args, device, (prompts, lengths))
        print(pairing, results[pairing], flush=True)
        text = report(results, args, env)
        payload = {"env": env, "args": vars(args), "lengths": lengths, "results": results}
        write_results(name, payload, text)
    print(text)


if __name__ == "__main__":
    main()
