"""What bitwise learner/rollout alignment buys in NVFP4 GRPO, as an ablation anyone can re-run:
the same task, model, warm start and seeds under several learner/rollout pairings.

    python -m benchmarks.alignment_ablation --preset cpu [--seeds 0,1,2] [--variants ...]
        [--settings on,off] [--work-dir DIR] [--deadline-s S] [--smoke] [key=value ...]
    python -m benchmarks.alignment_ablation --preset gpu --seeds 0 --variants strict,mismatch,bf16
        --settings on --tag part1      # about three GPU runs fit one 10-minute device call

Variants (each a `minite train` run; `VARIANTS` below maps them to the CLI):
- `strict`: NVFP4 W4A4, batch-invariant; the rollout is minite's engine: learner == rollout
  log-probs, bitwise (gap 0 at every step).
- `mismatch`: the SAME learner and the same NVFP4 weights, but the rollout computes the way a
  stock engine does (`rollout_engine=stock`, rl/train/stock_rollout.py: minite's exported NVFP4 bytes
  decoded, W4A16 in BF16 eager transformers with a KV cache, as vLLM serves an NVFP4 checkpoint
  on Hopper); no correction: the PPO ratio's "old" log-probs are the learner's, the samples the
  stock engine's.
- `mismatch-tis`: `mismatch` with token-level truncated IS (cap 2), the usual correction.
- `te`: NVFP4 with per-tensor activation scales on both sides (not batch-invariant) + TIS cap 2.
- `te-notis`: `te` without the correction.
- `bf16`: no quantization (minite's invariant kernels, bitwise aligned too).

Settings: `on` (on-policy, the preset's `updates_per_batch` and lr) for every variant; `off`
(off-policy: `OFF_POLICY` below: several optimizer steps per batch and a larger lr) for
`OFF_POLICY_VARIANTS`. Every run of a seed starts from the same cached warm start, draws the same
prompts and, on equal weights, the same sampling noise.

Output under $OUT (default benchmarks/results/): `<date>_alignment_ablation_<preset>_<commit>`
`.md` (per variant and setting: held-out accuracy (greedy) and training reward at start / end,
mean and seed range, the mismatch per step (max |dlogp|, k3 KL), divergence; then one row per
run), `.json` (the same with every run's curves), `_curves.png` (seed bands). The rows are
deterministic: `--seeds 0` reproduces seed 0's rows exactly (every field but the timings; the
runs pin torch to `--threads` threads).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.common import environment, result_stem, run_train, write_results
from benchmarks.grpo_evidence import EDGE_STEPS, read_records, summarize
from fp4_compile.rl.train.presets import get_preset

VARIANTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "strict": ("strict", ()),
    "mismatch": ("strict", ("rollout_engine=stock", "tis_cap=none")),
    "bf16": ("bf16", ()),
    "mismatch-tis": ("strict", ("rollout_engine=stock", "tis_cap=2")),
    "te": ("te", ("tis_cap=2",)),
    "te-notis": ("te", ("tis_cap=none",)),
}
"""Ablation variant -> (the `minite train --variant`, the settings it adds)."""

PRESETS: dict[str, tuple[str, tuple[str, ...]]] = {
    # The tiny Qwen3 cut to ONE layer (hidden 64, 4 heads / 2 KV heads, 0.03M parameters) on
    # 3-digit sort with half credit for right digits, sized for 2 loaded CPU cores: 14 warm-start
    # steps leave a policy whose samples are almost never exactly right (0.3%), 8 prompts x 8
    # samples per step, 300 GRPO steps at lr 1e-3 (calibrated in eager FP32: the sampled reward
    # rises 0.07 -> 0.8 and takes off after about 100 steps; docs/alignment.md).
    "cpu": (
        "tiny",
        (
            "layers=1",
            "task=sort",
            "num_digits=3",
            "partial_credit=0.5",
            "warm_start_steps=14",
            "lr=1e-3",
            "steps=300",
            "prompts_per_step=8",
            "group_size=8",
            "eval_every=25",
            "eval_size=128",
            "checkpoint_every=300",
            "keep_checkpoints=1",
        ),
    ),
    # h200-evidence (Qwen3-MoE 28M, 6-digit sort, 150 steps of 64 x 8): one variant per call
    "gpu": ("h200-evidence", ("checkpoint_every=1000", "keep_checkpoints=1")),
}
"""Ablation preset -> (the `minite train` preset, the settings it adds)."""

OFF_POLICY = ("updates_per_batch=4", "lr_scale=2")
"""The off-policy setting: 4 optimizer steps per rollout batch (the last three on a policy that
has moved away from the one that sampled) and 2x the preset's lr (`lr_scale` is this script's: it
multiplies the preset's lr)."""
OFF_POLICY_VARIANTS = ("strict", "mismatch")
SETTINGS = ("on", "off")
SMOKE = (
    "hidden=32",
    "layers=1",
    "heads=2",
    "kv_heads=1",
    "head_dim=16",
    "intermediate=64",
    "num_digits=3",
    "prompts_per_step=2",
    "group_size=2",
    "steps=3",
    "warm_start_steps=2",
    "warm_start_batch=8",
    "eval_every=2",
    "eval_size=4",
    "compile=false",
)
"""A seconds-long stand-in of every run (eager: the loop, the stock engine and the summary)."""
TIMING_KEYS = ("wall_s", "step_s", "rollout_s", "learner_s", "first_step_s")
TAKEOFF = 0.5
"""A run "took off" at the first step whose 10-step mean training reward reaches this (the
sampled answers are then mostly right): how fast a variant learns, where the end points tie."""
DIVERGED_DROP = 0.05
"""A run "diverged" when a logged number is not finite, or when the sampled training reward of
its last `EDGE_STEPS` steps is this far below that of its first (it got worse at what it is
trained on). Held-out accuracy is not used: at this preset's size it first drops to 0 in every
variant (the policy learns to sample before it learns to be right) and recovers late."""


def run_overrides(
    preset: str, variant: str, setting: str, seed: int, extra: list[str]
) -> list[str]:
    """The key=value settings of one run (the preset's, the variant's, the setting's, the seed,
    then the command line's)."""
    base_preset, preset_over = PRESETS[preset]
    cli_variant, variant_over = VARIANTS[variant]
    over = [*preset_over, *variant_over]
    if setting == "off":
        for item in OFF_POLICY:
            key, _, value = item.partition("=")
            if key == "lr_scale":
                cfg = get_preset(base_preset, cli_variant).with_overrides([*over, *extra])
                over.append(f"lr={cfg.lr * float(value):g}")
            else:
                over.append(item)
    return [*over, f"seed={seed}", *extra]


CORE = 4
"""The first this many variants of `--variants` run on every seed before the others start."""


def plan(preset: str, variants: list[str], settings: list[str], seeds: list[int]) -> list[tuple]:
    """(variant, setting, seed) in run order, in tiers so that a cut ablation still has seed
    bands for the variants that matter most: the first `CORE` variants on-policy (seed by seed),
    then the other on-policy variants, then the off-policy runs (seed by seed)."""
    on = [v for v in variants] if "on" in settings else []
    off = [v for v in variants if v in OFF_POLICY_VARIANTS] if "off" in settings else []
    tiers = [(on[:CORE], "on"), (on[CORE:], "on"), (off, "off")]
    return [(v, setting, seed) for vs, setting in tiers for seed in seeds for v in vs]


def run_one(
    preset,
    variant,
    setting,
    seed,
    work: Path,
    extra: list[str],
    timeout_s: float,
    own_cache: bool = False,
    reuse: bool = False,
) -> dict:
    """One `minite train` run in a subprocess; its figures (partial when cut). The warm start is
    cached in work/cache (shared by the runs of a seed), or in the run's own folder when runs go
    in parallel (`own_cache`: the same deterministic warm start, computed by each run)."""
    base_preset, _ = PRESETS[preset]
    cli_variant, _ = VARIANTS[variant]
    over = run_overrides(preset, variant, setting, seed, extra)
    run_dir = work / f"{variant}-{setting}-s{seed}"
    over += [f"cache_dir={run_dir / 'cache' if own_cache else work / 'cache'}"]
    if reuse and (run_dir / "train.log").exists():  # finished before: deterministic, keep it
        print(f"{run_dir.name}: finished before, reused", flush=True)
        return rows_from_work(preset, [(variant, setting, seed)], work, extra)[0]
    rc, log, wall, run_dir = run_train(base_preset, cli_variant, work, over, timeout_s, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "train.log").write_text(log)
    planned = get_preset(base_preset, cli_variant).with_overrides(over).steps
    row = {"variant": variant, "setting": setting, "seed": seed, "rc": rc, "wall_s": round(wall, 1)}
    row.update(summarize(read_records(run_dir), steps_planned=planned))
    row.update(run_figures(row))
    if rc != 0:
        row["log_tail"] = log[-3000:]
    print(json.dumps({k: v for k, v in row.items() if k not in ("curves", "log_tail")}), flush=True)
    return row


def rows_from_work(preset, runs, work: Path, extra: list[str]) -> list[dict]:
    """The rows of the planned runs from the run folders under `work` as they are now
    (`--from-work`: the figures of an ablation still running, or cut): a finished run has its
    train.log; a run under way keeps the steps it has logged ("running"); one not started yet
    is "not run"."""
    base_preset, _ = PRESETS[preset]
    rows = []
    for v, s, seed in runs:
        run_dir = work / f"{v}-{s}-s{seed}"
        if not (run_dir / "metrics.jsonl").exists():
            rows.append({"variant": v, "setting": s, "seed": seed, "skipped": "not run (yet)"})
            continue
        over = run_overrides(preset, v, s, seed, extra)
        planned = get_preset(base_preset, VARIANTS[v][0]).with_overrides(over).steps
        finished = (run_dir / "train.log").exists()
        row = {
            "variant": v,
            "setting": s,
            "seed": seed,
            "rc": 0 if finished else "running",
            "wall_s": None,
        }
        row.update(summarize(read_records(run_dir), steps_planned=planned))
        row.update(run_figures(row))
        rows.append(row)
    return rows


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and x == x and abs(x) != float("inf")


def run_figures(row: dict) -> dict:
    """The mismatch over time and divergence of one run, from its curves."""
    c = row.get("curves", {})
    k3, gap = c.get("rollout_corr/k3_kl", []), c.get("mismatch/max_abs_dlogp", [])
    out: dict = {}
    if k3:
        n = max(1, len(k3) // 3)
        out["k3_kl_mean"] = _mean(k3)
        out["k3_kl_thirds"] = [_mean(k3[:n]), _mean(k3[n : 2 * n]), _mean(k3[2 * n :])]
        out["gap_median"] = sorted(gap)[len(gap) // 2]
        out["gap_thirds"] = [max(gap[:n]), max(gap[n : 2 * n] or [0.0]), max(gap[2 * n :] or [0.0])]
    rw = c.get("reward/mean", [])
    out["takeoff_step"] = None  # the first step whose EDGE_STEPS-step mean reward >= TAKEOFF
    for j in range(EDGE_STEPS - 1, len(rw)):
        if sum(rw[j - EDGE_STEPS + 1 : j + 1]) / EDGE_STEPS >= TAKEOFF:
            out["takeoff_step"] = c["step"][j]
            break
    numbers = [x for k, v in c.items() if k != "step" for x in v if x is not None]
    bad = [x for x in numbers if not _finite(x)]
    drop = None
    if row.get("reward_first") is not None and row.get("reward_last") is not None:
        drop = row["reward_first"] - row["reward_last"]
    out["diverged"] = bool(bad) or (drop is not None and drop >= DIVERGED_DROP)
    return out


def aggregate(rows: list[dict]) -> list[dict]:
    """One entry per (variant, setting): mean and [min, max] over the seeds of each figure."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if not r.get("skipped"):
            groups.setdefault((r["variant"], r["setting"]), []).append(r)
    out = []
    for (variant, setting), rs in groups.items():
        entry = {
            "variant": variant,
            "setting": setting,
            "seeds": [r["seed"] for r in rs],
            "complete": all(r.get("complete") for r in rs),
        }
        for key in (
            "eval_before",
            "eval_after",
            "eval_best",
            "reward_first",
            "reward_last",
            "exact_first",
            "exact_last",
            "k3_kl_mean",
            "gap_max",
            "gap_median",
        ):
            xs = [r[key] for r in rs if r.get(key) is not None]
            if xs:
                entry[key] = {"mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs)}
        gains = [
            r["eval_after"] - r["eval_before"]
            for r in rs
            if r.get("eval_after") is not None and r.get("eval_before") is not None
        ]
        if gains:
            entry["eval_gain"] = {
                "mean": sum(gains) / len(gains),
                "min": min(gains),
                "max": max(gains),
            }
        took = [r["takeoff_step"] for r in rs if r.get("takeoff_step") is not None]
        entry["takeoff"] = {
            "steps": [r.get("takeoff_step") for r in rs],
            "never": len(rs) - len(took),
            "median": sorted(took)[len(took) // 2] if took else None,
        }
        entry["diverged"] = sum(bool(r.get("diverged")) for r in rs)
        entry["gap_zero_every_step"] = all(r.get("gap_zero_every_step") for r in rs)
        out.append(entry)
    return out


def _f(x, spec=".3f") -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return format(x, spec)


def _spread(d: dict | None, spec=".3f") -> str:
    if not d:
        return "-"
    return f"{_f(d['mean'], spec)} [{_f(d['min'], spec)}, {_f(d['max'], spec)}]"


def markdown(env: dict, args, extra: list[str], rows: list[dict], agg: list[dict]) -> str:
    base_preset, preset_over = PRESETS[args.preset]
    md = [
        f"# Alignment ablation ({args.preset}): {env['gpu']}, CPU {env.get('cpu', '?')}, "
        f"{env.get('threads', '?')} torch thread(s) a run, torch {env['torch']}, commit "
        f"{env['commit']}",
        "",
        f"`python -m benchmarks.alignment_ablation --preset {args.preset} --seeds {args.seeds} "
        f"--variants {args.variants} --settings {args.settings}"
        + (f" {' '.join(extra)}" if extra else "")
        + "`: "
        f"`minite train {base_preset}` with {' '.join(preset_over)}; off-policy setting: "
        f"{' '.join(OFF_POLICY)}. Variants: docs/alignment.md. Held-out accuracy: greedy, exact "
        "answers, on problems training never draws (through each variant's own rollout engine). "
        f"Reward: mean sampled reward of the first / last {EDGE_STEPS} steps (partial credit "
        "included). Mismatch: max |logp_learner - logp_rollout| over a step's tokens and the k3 "
        "KL(rollout || learner) per step (rl/diagnostics/mismatch.py). Each cell: mean over seeds "
        "[min, max].",
        "",
        "| variant | setting | seeds | held-out acc start | held-out acc end | gain | reward "
        "first -> last | step reward >= 0.5 (per seed) | k3 KL (mean over steps) | max abs dlogp "
        "(median step / max) | diverged |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in agg:
        seeds = ",".join(map(str, e["seeds"])) + ("" if e["complete"] else " (some cut)")
        gap = e.get("gap_median"), e.get("gap_max")
        md.append(
            f"| {e['variant']} | {e['setting']} | {seeds} | {_spread(e.get('eval_before'))} | "
            f"{_spread(e.get('eval_after'))} | {_spread(e.get('eval_gain'), '+.3f')} | "
            f"{_f((e.get('reward_first') or {}).get('mean'))} -> "
            f"{_f((e.get('reward_last') or {}).get('mean'))} | "
            f"{', '.join('never' if t is None else str(t) for t in e['takeoff']['steps'])} | "
            f"{_spread(e.get('k3_kl_mean'), '.2e')} | "
            f"{_f((gap[0] or {}).get('mean'), '.3g')} / {_f((gap[1] or {}).get('max'), '.3g')} | "
            f"{e['diverged']} of {len(e['seeds'])} |"
        )
    md += [
        "",
        "## every run",
        "",
        "| variant | setting | seed | steps | held-out acc start -> end (best) | reward first -> "
        "last | step reward >= 0.5 | k3 KL by thirds of the run | max abs dlogp by thirds | "
        "gap 0 every step | diverged | wall s | rc |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r.get("skipped"):
            continue
        steps = f"{r.get('steps', 0)}" + ("" if r.get("complete") else " (cut)")
        k3 = " / ".join(_f(x, ".1e") for x in r.get("k3_kl_thirds", []))
        gaps = " / ".join(_f(x, ".3g") for x in r.get("gap_thirds", []))
        md.append(
            f"| {r['variant']} | {r['setting']} | {r['seed']} | {steps} | "
            f"{_f(r.get('eval_before'))} -> {_f(r.get('eval_after'))} ({_f(r.get('eval_best'))}) | "
            f"{_f(r.get('reward_first'))} -> {_f(r.get('reward_last'))} | "
            f"{r.get('takeoff_step') if r.get('takeoff_step') is not None else 'never'} | "
            f"{k3 or '-'} | "
            f"{gaps or '-'} | {r.get('gap_zero_every_step', '-')} | {r.get('diverged', '-')} | "
            f"{_f(r.get('wall_s'), '.0f')} | {r['rc']} |"
        )
    skipped: dict[tuple, list[str]] = {}
    for r in rows:
        if r.get("skipped"):
            key = (r["skipped"], r["variant"], r["setting"])
            skipped.setdefault(key, []).append(str(r["seed"]))
    if skipped:
        md += [
            "",
            "Not in the tables: "
            + "; ".join(
                f"{v} ({setting}-policy) seeds {','.join(seeds)}: {why}"
                for (why, v, setting), seeds in skipped.items()
            )
            + ".",
        ]
    return "\n".join(md) + "\n"


def _band(ax, xs_list, ys_list, label, smooth: int = 1, log: bool = False):
    """Mean over seeds (common steps) with a min-max band."""
    n = min(len(x) for x in xs_list)
    if n == 0:
        return
    xs = xs_list[0][:n]
    cols = []
    for ys in ys_list:
        ys = [y if y is not None else float("nan") for y in ys[:n]]
        if smooth > 1:
            ys = [
                sum(ys[max(0, j - smooth + 1) : j + 1]) / len(ys[max(0, j - smooth + 1) : j + 1])
                for j in range(n)
            ]
        cols.append(ys)
    mean = [sum(c[j] for c in cols) / len(cols) for j in range(n)]
    lo = [min(c[j] for c in cols) for j in range(n)]
    hi = [max(c[j] for c in cols) for j in range(n)]
    (line,) = ax.plot(xs, mean, label=label, linewidth=1.2)
    ax.fill_between(xs, lo, hi, alpha=0.18, color=line.get_color(), linewidth=0)


def plot(rows: list[dict], path: Path) -> None:
    """Per setting one row of panels: reward (10-step mean), held-out accuracy, k3 KL and max
    |dlogp| vs step, each variant's seed mean with its min-max band."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    done = [r for r in rows if not r.get("skipped") and r.get("curves", {}).get("step")]
    settings = [s for s in SETTINGS if any(r["setting"] == s for r in done)] or ["on"]
    titles = (
        "training reward (10-step mean)",
        "held-out accuracy (greedy)",
        "k3 KL(rollout || learner)",
        "max |logp_learner - logp_rollout|",
    )
    fig, axes = plt.subplots(len(settings), 4, figsize=(16, 3.3 * len(settings)), squeeze=False)
    for i, setting in enumerate(settings):
        variants = []
        for r in done:
            if r["setting"] == setting and r["variant"] not in variants:
                variants.append(r["variant"])
        for v in variants:
            rs = [r for r in done if r["setting"] == setting and r["variant"] == v]
            cs = [r["curves"] for r in rs]
            label = f"{v} ({len(rs)} seeds)"
            _band(
                axes[i][0],
                [c["step"] for c in cs],
                [c["reward/mean"] for c in cs],
                label,
                smooth=EDGE_STEPS,
            )
            _band(axes[i][1], [c["eval_step"] for c in cs], [c["eval/accuracy"] for c in cs], label)
            _band(
                axes[i][2],
                [c["step"] for c in cs],
                [c["rollout_corr/k3_kl"] for c in cs],
                label,
                smooth=EDGE_STEPS,
            )
            _band(
                axes[i][3],
                [c["step"] for c in cs],
                [c["mismatch/max_abs_dlogp"] for c in cs],
                label,
                smooth=EDGE_STEPS,
            )
        for ax, title in zip(axes[i], titles):
            ax.set_title(f"{setting}-policy: {title}", fontsize=9)
            ax.set_xlabel("GRPO step", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
        for ax in axes[i][2:]:
            ax.set_yscale("symlog", linthresh=1e-4)  # strict and bf16 sit at exactly 0
        axes[i][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=70)
    plt.close(fig)


def numbers_of(row: dict) -> dict:
    """A row without its timings: what `--seeds 0` must reproduce exactly."""
    out = {k: v for k, v in row.items() if k not in (*TIMING_KEYS, "log_tail")}
    out["curves"] = {k: v for k, v in row.get("curves", {}).items() if not k.startswith("perf/")}
    return out


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x {os.cpu_count()}"
    except OSError:
        pass
    return f"unknown x {os.cpu_count()}"


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="cpu", choices=sorted(PRESETS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--settings", default="on,off", help="on (on-policy), off (off-policy)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of every run")
    parser.add_argument(
        "--jobs", type=int, default=1, help="runs at a time (default 1: one after the other)"
    )
    parser.add_argument(
        "--deadline-s",
        type=float,
        default=float("inf"),
        help="do not start a run after this many seconds",
    )
    parser.add_argument("--run-timeout-s", type=float, default=3600.0)
    parser.add_argument(
        "--work-dir", default=None, help="run folders (default: a temp folder, removed at the end)"
    )
    parser.add_argument("--smoke", action="store_true", help="seconds-long runs (see SMOKE)")
    parser.add_argument(
        "--tag", default="", help="appended to the results' name (e.g. one device call's part)"
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep the runs under --work-dir that finished before (their "
        "train.log exists) instead of running them again",
    )
    parser.add_argument(
        "--from-work",
        action="store_true",
        help="run nothing: summarize the run folders under --work-dir as they "
        "are (an ablation under way or cut)",
    )
    parser.add_argument("overrides", nargs="*", help="key=value settings for every run")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    seeds = [int(s) for s in args.seeds.split(",") if s != ""]
    variants = [v for v in args.variants.split(",") if v]
    settings = [s for s in args.settings.split(",") if s]
    for v in variants:
        if v not in VARIANTS:
            raise ValueError(f"--variants: each must be one of {list(VARIANTS)}, got {v!r}")
    for s in settings:
        if s not in SETTINGS:
            raise ValueError(f"--settings: each must be one of {SETTINGS}, got {s!r}")
    extra = [*(SMOKE if args.smoke else ()), *args.overrides]
    if args.preset == "cpu" or args.smoke:
        extra = ["device=cpu", *extra]
    runs = plan(args.preset, variants, settings, seeds)
    base_preset, _ = PRESETS[args.preset]
    for v, s, seed in runs:  # every setting checked before the first (long) run
        get_preset(base_preset, VARIANTS[v][0]).with_overrides(
            run_overrides(args.preset, v, s, seed, extra)
        )
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the runs' torch threads (determinism)
    env = environment()
    env["threads"] = args.threads
    env["cpu"] = _cpu_name()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="minite_alignment_ablation_"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"{len(runs)} runs: {runs}", flush=True)

    def one(run):
        v, s, seed = run
        if time.perf_counter() - t0 > args.deadline_s:
            return {"variant": v, "setting": s, "seed": seed, "skipped": "not run: deadline"}
        return run_one(
            args.preset,
            v,
            s,
            seed,
            work,
            extra,
            args.run_timeout_s,
            own_cache=args.jobs > 1,
            reuse=args.reuse,
        )

    if args.from_work:
        if args.work_dir is None:
            raise ValueError("--from-work needs --work-dir")
        rows = rows_from_work(args.preset, runs, work, extra)
    elif args.jobs > 1:  # runs in parallel (each single-threaded: the same numbers)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(args.jobs) as pool:
            rows = list(pool.map(one, runs))
    else:
        rows = [one(run) for run in runs]
    agg = aggregate(rows)
    text = markdown(env, args, extra, rows, agg)
    print(text)
    payload = {"env": env, "args": vars(args), "overrides": extra, "rows": rows, "aggregate": agg}
    topic = f"alignment_ablation_{args.preset}" + ("_smoke" if args.smoke else "")
    topic += f"_{args.tag}" if args.tag else ""
    written = write_results(topic, payload, text)
    out = Path(os.environ.get("OUT", "benchmarks/results"))
    png = out / f"{result_stem(topic, env)}_curves.png"
    plot(rows, png)
    written.append(png)
    if args.work_dir is None:
        shutil.rmtree(work)
    print("wrote", *map(str, written), f"in {time.perf_counter() - t0:.0f} s", flush=True)
    return payload


if __name__ == "__main__":
    main()
