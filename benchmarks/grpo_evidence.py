"""Does NVFP4 GRPO learn like BF16? The evidence run: presets `h200-evidence` (Qwen3-MoE, 28M
parameters) and optionally `h200-evidence-dense` (Qwen3, 24M), each in the variants strict,
bf16 and te with the same seeds, in ONE process tree within a wall-clock deadline, summarized
in one results file.

    python -m benchmarks.grpo_evidence [--presets h200-evidence[,h200-evidence-dense]]
        [--variants strict,bf16,te] [--deadline-s 480] [--smoke] [key=value ...]

Each run is `minite train PRESET --variant V` in a subprocess (its own Dynamo state); the
variants of a preset share one warm-start cache folder, so they start from the same weights.
Under $OUT (default benchmarks/results/), named `<date>_grpo_<presets>_<commit>` (presets
joined by "_": `grpo_h200-evidence` by default):

- `.md`: per run the held-out accuracy (greedy, problems never trained on) before GRPO and
  after the last step, the training reward of the first and last 10 steps, the learner/rollout
  gap (max |logp_learner - logp_rollout| over all steps, and whether it was 0 at every step),
  the median step time, and per preset strict's final held-out accuracy minus bf16's;
- `.json`: the same, plus every run's curves (step, reward, held-out accuracy, gap, step time);
- `.png`: one row per preset: training reward (10-step mean), held-out accuracy, gap, step time;
- `_runs.tgz`: each run's metrics.jsonl, summary.txt, plots and log (no checkpoints).

The deadline keeps the whole call inside a device command's limit: a run gets what is left of
it (minus `RESERVE_S` for the summary) and is not started with less than `--min-start-s`; a run
cut short keeps the steps it logged and is marked in the table. `--smoke` shrinks every preset
to a CPU-sized model and a few steps (key=value settings still apply after it), so the whole
path can be checked on a CPU before a device call.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

from benchmarks.common import environment, median, result_stem, run_train, write_results
from fp4_compile.rl.train.presets import get_preset
from fp4_compile.rl.train.run_log import step_records

VARIANTS = ("strict", "bf16", "te")
RESERVE_S = 25.0
"""Seconds of the deadline kept for the summary, plot and archive after the last run."""
EDGE_STEPS = 10
"""Training reward is reported as the mean of the first and of the last this many steps."""
SMOKE = (
    "device=cpu",
    "hidden=64",
    "layers=2",
    "heads=4",
    "kv_heads=2",
    "head_dim=32",
    "intermediate=128",
    "experts=4",
    "experts_per_token=2",
    "moe_intermediate=32",
    "num_digits=3",
    "prompts_per_step=2",
    "group_size=2",
    "steps=3",
    "warm_start_steps=2",
    "warm_start_batch=8",
    "eval_every=2",
    "eval_size=4",
    "checkpoint_every=3",
    "compile=false",
)
"""A CPU-sized stand-in for every preset: the same code path in seconds per run."""
CURVES = (
    "reward/mean",
    "reward/exact_frac",
    "mismatch/max_abs_dlogp",
    "rollout_corr/k3_kl",
    "perf/step_s",
)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def read_records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summarize(records: list[dict], *, steps_planned: int) -> dict:
    """One run's figures from its metrics.jsonl records (GRPO steps and eval records)."""
    steps = step_records(records)
    evals = [r for r in records if "eval/accuracy" in r]
    row: dict = {"steps": len(steps), "complete": len(steps) == steps_planned}
    if evals:
        row["eval_before"] = evals[0]["eval/accuracy"] if evals[0]["step"] == 0 else None
        row["eval_after"] = evals[-1]["eval/accuracy"]
        row["eval_after_step"] = evals[-1]["step"]
        row["eval_best"] = max(r["eval/accuracy"] for r in evals)
    if steps:
        row["reward_first"] = _mean([r["reward/mean"] for r in steps[:EDGE_STEPS]])
        row["reward_last"] = _mean([r["reward/mean"] for r in steps[-EDGE_STEPS:]])
        row["exact_first"] = _mean([r["reward/exact_frac"] for r in steps[:EDGE_STEPS]])
        row["exact_last"] = _mean([r["reward/exact_frac"] for r in steps[-EDGE_STEPS:]])
        gaps = [r["mismatch/max_abs_dlogp"] for r in steps]
        row["gap_max"] = max(gaps)
        row["gap_zero_every_step"] = all(g == 0 for g in gaps)
        row["k3_kl_max"] = max(r["rollout_corr/k3_kl"] for r in steps)
        steady = steps[1:] or steps  # step 0 includes compilation
        for key in ("step_s", "rollout_s", "learner_s"):
            row[key] = median([r[f"perf/{key}"] for r in steady])
        row["first_step_s"] = steps[0]["perf/step_s"]
    row["curves"] = {
        "step": [r["step"] for r in steps],
        **{k: [r[k] for r in steps] for k in CURVES},
        "eval_step": [r["step"] for r in evals],
        "eval/accuracy": [r["eval/accuracy"] for r in evals],
        "eval/reward": [r.get("eval/reward") for r in evals],
    }
    return row


def run_one(preset, variant, work: Path, overrides: list[str], timeout_s: float) -> dict:
    """`minite train PRESET --variant V` with a wall-clock limit; its figures (partial when cut)."""
    rc, log, wall, run_dir = run_train(preset, variant, work, overrides, timeout_s)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "train.log").write_text(log)
    planned = get_preset(preset, variant).with_overrides(overrides).steps
    row = {"preset": preset, "variant": variant, "rc": rc, "wall_s": round(wall, 1)}
    row.update(summarize(read_records(run_dir), steps_planned=planned))
    if rc != 0:
        row["log_tail"] = log[-3000:]
    print({k: v for k, v in row.items() if k not in ("curves", "log_tail")}, flush=True)
    return row


def _fmt(x, spec: str = ".3f") -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return format(x, spec) if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def markdown(env: dict, args, overrides: list[str], rows: list[dict], verdicts: dict) -> str:
    md = [
        f"# GRPO evidence: NVFP4 strict / BF16 / te, same seeds: {env['gpu']}, torch "
        f"{env['torch']}, triton {env['triton']}, commit {env['commit']}",
        "",
        f"presets {args.presets}; variants {args.variants}; settings replaced: "
        f"{' '.join(overrides) or '(none)'}. NVFP4 on Hopper is emulated NVFP4 (sm_90). "
        "Held-out accuracy: greedy, exact answers, on problems from the split training never "
        "draws from (rl/train/evaluation.py). Reward: mean over the first / last "
        f"{EDGE_STEPS} steps (partial credit included).",
        "",
        "| preset | variant | steps | held-out acc before -> after (best) | reward first -> last "
        "| exact first -> last | gap max | gap 0 every step | k3 KL max | step s (first) "
        "| rollout s | learner s | wall s | rc |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r.get("skipped"):
            md.append(f"| {r['preset']} | {r['variant']} | not run: {r['skipped']} |" + " |" * 11)
            continue
        steps = f"{r['steps']}" + ("" if r.get("complete") else " (cut)")
        md.append(
            f"| {r['preset']} | {r['variant']} | {steps} | {_fmt(r.get('eval_before'))} -> "
            f"{_fmt(r.get('eval_after'))} ({_fmt(r.get('eval_best'))}) | "
            f"{_fmt(r.get('reward_first'))} -> {_fmt(r.get('reward_last'))} | "
            f"{_fmt(r.get('exact_first'))} -> {_fmt(r.get('exact_last'))} | "
            f"{_fmt(r.get('gap_max'), '.3g')} | {_fmt(r.get('gap_zero_every_step'))} | "
            f"{_fmt(r.get('k3_kl_max'), '.3g')} | {_fmt(r.get('step_s'), '.2f')} "
            f"({_fmt(r.get('first_step_s'), '.1f')}) | {_fmt(r.get('rollout_s'), '.2f')} | "
            f"{_fmt(r.get('learner_s'), '.2f')} | {r['wall_s']} | {r['rc']} |"
        )
    md.append("")
    for preset, v in verdicts.items():
        md.append(f"- `{preset}`: {v}")
    return "\n".join(md) + "\n"


def verdict(rows: list[dict]) -> str:
    """strict's final held-out accuracy against bf16's (goal: within 2 points), and collapse."""
    by = {r["variant"]: r for r in rows if not r.get("skipped")}
    parts = []
    s, b = by.get("strict", {}), by.get("bf16", {})
    if s.get("eval_after") is not None and b.get("eval_after") is not None:
        d = s["eval_after"] - b["eval_after"]
        at = (
            f"after step {s['eval_after_step']}"
            if s["eval_after_step"] == b["eval_after_step"]
            else f"at DIFFERENT steps (strict {s['eval_after_step']}, bf16 {b['eval_after_step']})"
        )
        parts.append(
            f"held-out accuracy strict - bf16 = {d:+.3f} {at} "
            f"({'within' if abs(d) <= 0.02 else 'outside'} the 0.02 goal)"
        )
    else:
        parts.append("strict vs bf16 held-out accuracy: not measured")
    for name, r in by.items():
        if r.get("eval_before") is not None and r.get("eval_after") is not None:
            collapsed = r["eval_after"] < r["eval_before"] - 0.05
            parts.append(
                f"{name} held-out {r['eval_before']:.3f} -> {r['eval_after']:.3f}"
                + (" (COLLAPSE: below its start by > 0.05)" if collapsed else "")
            )
    return "; ".join(parts)


def plot(rows: list[dict], presets: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    panels = (
        "training reward (10-step mean)",
        "held-out accuracy (greedy)",
        "max |logp_learner - logp_rollout|",
        "step time s",
    )
    fig, axes = plt.subplots(len(presets), 4, figsize=(18, 3.6 * len(presets)), squeeze=False)
    for i, preset in enumerate(presets):
        for r in (r for r in rows if r["preset"] == preset and not r.get("skipped")):
            c, label = r["curves"], r["variant"]
            rw = c["reward/mean"]
            smooth = [_mean(rw[max(0, j - EDGE_STEPS + 1) : j + 1]) for j in range(len(rw))]
            axes[i][0].plot(c["step"], smooth, label=label)
            axes[i][1].plot(c["eval_step"], c["eval/accuracy"], marker=".", label=label)
            axes[i][2].plot(c["step"], c["mismatch/max_abs_dlogp"], label=label)
            axes[i][3].plot(c["step"][1:], c["perf/step_s"][1:], label=label)
        for ax, title in zip(axes[i], panels):
            ax.set_title(f"{preset}: {title}", fontsize=9)
            ax.set_xlabel("GRPO step", fontsize=8)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        axes[i][2].set_yscale("symlog", linthresh=1e-6)  # strict and bf16 sit at exactly 0
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def archive(work: Path, path: Path) -> None:
    """Each run's metrics, summary, plots and log; never checkpoints or the warm-start cache."""
    with tarfile.open(path, "w:gz") as tar:
        for run_dir in sorted(p for p in work.iterdir() if p.is_dir() and p.name != "cache"):
            for f in sorted(run_dir.iterdir()):
                if f.is_file() and f.suffix in (".jsonl", ".txt", ".png", ".log"):
                    tar.add(f, arcname=f"{run_dir.name}/{f.name}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="h200-evidence")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--deadline-s", type=float, default=480.0, help="wall-clock limit of the whole script"
    )
    parser.add_argument(
        "--min-start-s", type=float, default=60.0, help="do not start a run with less time left"
    )
    parser.add_argument(
        "--work-dir", default=None, help="run folders (default: a temp folder, removed at the end)"
    )
    parser.add_argument("--smoke", action="store_true", help="CPU-sized stand-in (see SMOKE)")
    parser.add_argument("overrides", nargs="*", help="key=value settings for every run")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    presets = [p for p in args.presets.split(",") if p]
    variants = [v for v in args.variants.split(",") if v]
    overrides = [*(SMOKE if args.smoke else ()), *args.overrides]
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"--variants: each must be one of {VARIANTS}, got {v!r}")
    for p in presets:  # every setting checked before the first (long) run starts
        for v in variants:
            get_preset(p, v).with_overrides(overrides)
    env = environment()
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="minite_grpo_evidence_"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for preset in presets:
        for variant in variants:
            left = args.deadline_s - (time.perf_counter() - t0) - RESERVE_S
            if left < args.min_start_s:
                rows.append({"preset": preset, "variant": variant, "skipped": "deadline"})
                print(f"{preset} {variant}: not run, {left:.0f} s left of the deadline")
                continue
            rows.append(run_one(preset, variant, work, overrides, left))
    verdicts = {p: verdict([r for r in rows if r["preset"] == p]) for p in presets}
    text = markdown(env, args, overrides, rows, verdicts)
    print(text)
    payload = {
        "env": env,
        "args": vars(args),
        "overrides": overrides,
        "rows": rows,
        "verdicts": verdicts,
    }
    topic = "grpo_" + "_".join(presets)  # grpo_h200-evidence, as grpo_variants' grpo_h200-moe
    written = write_results(topic, payload, text)
    stem = result_stem(topic, env)
    plot(rows, presets, out / f"{stem}.png")
    archive(work, out / f"{stem}_runs.tgz")
    written += [out / f"{stem}.png", out / f"{stem}_runs.tgz"]
    if args.work_dir is None:  # checkpoints and the warm-start cache are not results
        shutil.rmtree(work)
    print("wrote", *map(str, written), f"in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
