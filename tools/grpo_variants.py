"""A GRPO recipe in its three variants (strict, te, bf16) with the same seeds, one after the
other in one process group of runs: reward and mismatch curves (PNG), the final table (reward,
gap, learner and rollout tokens/s, step time) and the step-time ratio NVFP4 strict / BF16.

    python -m tools.grpo_variants [--recipe h200-moe] [--budget-s 170] [key=value ...]

Each variant runs `minite train RECIPE --variant V` as a subprocess with a wall-clock budget;
the warm start is shared (one cache folder). Results under $OUT (or benchmarks/results/) as
grpo_<recipe>.{json,md} plus each run's folder (metrics.jsonl, plots, summary.txt).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from benchmarks.common import environment, median, run_train, write_results
from fp4_compile.rl.train.run_log import step_records

VARIANTS = ("strict", "te", "bf16")


def run_variant(recipe: str, variant: str, out: Path, overrides: list[str], budget_s: float):
    rc, log, wall, run_dir = run_train(recipe, variant, out, overrides, budget_s)
    (out / f"{recipe}-{variant}.log").write_text(log)
    records = []
    metrics = run_dir / "metrics.jsonl"
    if metrics.exists():
        lines = metrics.read_text().splitlines()
        records = step_records([json.loads(line) for line in lines if line.strip()])
    row = {"variant": variant, "rc": rc, "wall_s": round(wall, 1), "steps": len(records)}
    if records:
        last = records[-5:]
        row["reward_first"] = records[0]["reward/mean"]
        row["reward_last5"] = sum(r["reward/mean"] for r in last) / len(last)
        gaps = [r.get("mismatch/max_abs_dlogp", float("nan")) for r in records]
        row["gap_max_over_steps"] = max(gaps)
        row["gap_zero_every_step"] = all(g == 0 for g in gaps)
        row["bitwise_frac_min"] = min(
            r.get("mismatch/frac_bitwise_equal", float("nan")) for r in records
        )
        steady = records[1:] or records  # step 0 includes compilation
        row["step_s"] = median([r["perf/step_s"] for r in steady])
        row["rollout_s"] = median([r["perf/rollout_s"] for r in steady])
        row["learner_s"] = median([r["perf/learner_s"] for r in steady])
        row["rollout_tok_s"] = median([r["perf/rollout_tokens_per_s"] for r in steady])
        row["learner_tok_s"] = median([r["perf/learner_tokens_per_s"] for r in steady])
    else:
        row["log_tail"] = log[-3000:]
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", default="h200-moe")
    parser.add_argument(
        "--budget-s", type=float, default=170.0, help="wall-clock budget per variant"
    )
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help="comma-separated subset of strict,te,bf16 (the step ratio needs strict and bf16)",
    )
    parser.add_argument("overrides", nargs="*", help="key=value settings for every variant")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or not variants:
        parser.error(f"--variants: unknown {unknown} (known: {list(VARIANTS)})")
    env = environment()
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    out.mkdir(parents=True, exist_ok=True)
    rows = [run_variant(args.recipe, v, out, args.overrides, args.budget_s) for v in variants]
    by = {r["variant"]: r for r in rows}
    ratio = None
    if "step_s" in by.get("strict", {}) and "step_s" in by.get("bf16", {}):
        ratio = by["bf16"]["step_s"] / by["strict"]["step_s"]
    md = [
        f"# GRPO `{args.recipe}`, variants {', '.join(variants)}, same seeds: {env['gpu']}, torch {env['torch']}, "
        f"triton {env['triton']}, commit {env['commit']}",
        f"settings replaced: {' '.join(args.overrides) or '(none)'}; NVFP4 is emulated NVFP4 (sm_90) on Hopper",
        "",
        "| variant | steps | reward first -> last 5 | gap (max over steps) | gap 0 every step | step s | rollout s | learner s | rollout tok/s | learner tok/s | rc |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "step_s" not in r:
            md.append(f"| {r['variant']} | {r['steps']} | no records | | | | | | | | {r['rc']} |")
            continue
        md.append(
            f"| {r['variant']} | {r['steps']} | {r['reward_first']:.3f} -> {r['reward_last5']:.3f} | "
            f"{r['gap_max_over_steps']:.3g} | {r['gap_zero_every_step']} | {r['step_s']:.2f} | "
            f"{r['rollout_s']:.2f} | {r['learner_s']:.2f} | {r['rollout_tok_s']:.0f} | "
            f"{r['learner_tok_s']:.0f} | {r['rc']} |"
        )
    md += [
        "",
        f"step time BF16 / NVFP4 strict: {ratio:.2f}x (goal >= 1.4x)"
        if ratio
        else "step-time ratio: not measured",
    ]
    text = "\n".join(md) + "\n"
    print(text)
    write_results(
        f"grpo_{args.recipe}",
        {"env": env, "args": vars(args), "rows": rows, "ratio_bf16_over_strict": ratio},
        text,
    )


if __name__ == "__main__":
    main()
