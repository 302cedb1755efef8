"""benchmarks.multi_gpu's arguments and report (markdown)."""

from __future__ import annotations

import argparse

from benchmarks.common import median


def _cmp(c: dict | None) -> str:
    if not c:
        return "-"
    return f"{c['rel_l2']:.3g} / {c['cosine']:.4f} / {c['equal_elements']}/{c['elements']}"


def report(records: list[dict], args, env: dict, world: int, engine: bool, checks: int) -> str:
    """The markdown of one run (rank 0's records, the engine's merged in)."""
    learners = world - 1 if engine else world
    steps = [r for r in records if "learner_step_s" in r]
    lines = [
        f"# Multi-GPU GRPO: FSDP2 learner on {learners} rank(s)"
        + (", rollout engine (weights='packed') on rank " + str(world - 1) if engine else "")
        + f"; {env['gpu']}, emulated NVFP4 (sm_90) where on Hopper, torch {env['torch']}, "
        f"commit {env['commit']}",
        "",
        f"{args.model}, {args.layers} layers, strict recipe; {args.prompts} prompts x "
        f"{args.group}, prompt {args.prompt}, {args.budget} new tokens; AdamW lr {args.lr}; "
        f"{args.steps} steps (the first compiles: medians over the rest where there are).",
        "",
        "| step | learner step s | tokens | rollout s | full-weight gather s |",
        "| --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(steps):
        lines.append(
            f"| {i} | {r['learner_step_s']:.3f} | {r['tokens']} | {r.get('rollout_s', float('nan')):.3f} "
            f"| {r['gather_s']:.3f} |"
        )
    warm = steps[1:] or steps
    step_s = median([r["learner_step_s"] for r in warm])
    if "single_step_s" in steps[0]:
        one_s = median([r["single_step_s"] for r in warm])
        lines += [
            "",
            f"Learner step, 1 process (no FSDP, whole batch): {one_s:.3f} s; "
            f"{learners} ranks: {step_s:.3f} s; scaling {one_s / step_s:.2f}x.",
        ]
    if engine:
        lines += [
            "",
            "Weight sync to the engine after each optimizer step (version 0: the initial weights), "
            "timed on the engine from a common barrier:",
            "",
            "| version | BF16 refit bytes | BF16 refit s (engine quantize s) | NVFP4 bytes (of them the "
            "held BF16 parameters) | NVFP4 sync s "
            "(learner quantize s) | bytes ratio | NVFP4 == engine's quantize (bytes differing) "
            "| store bytes changed | learner == rollout check prompts |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for v, r in enumerate(records):
            lines.append(
                f"| {v} | {r['bf16_bytes_sent']:,} | {r['bf16_refit_s']:.4f} ({r['bf16_engine_quantize_s']:.4f}) "
                f"| {r['bytes']:,} ({r['held_param_bytes']:,}) | {r['nvfp4_sync_s']:.4f} ({r['quantize_s']:.4f}) "
                f"| {r['bf16_bytes_sent'] / r['bytes']:.2f}x | {r['nvfp4_vs_engine_quantize_bytes_differing']} "
                f"| {r['store_bytes_changed']:,} | {r['learner_eq_rollout']} / {checks} |"
            )
    if "grad_n_vs_1" in steps[0]:
        lines += [
            "",
            "N ranks vs 1 process, relative L2 / cosine / elements bit-for-bit equal (the 1-process "
            "run follows its own weights: step 0 is the clean comparison):",
            "",
            "| step | gradient N vs 1 | split in ONE process vs 1 | N vs split in one | weights after "
            "the step N vs 1 | update N vs 1 |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for i, r in enumerate(steps):
            lines.append(
                f"| {i} | {_cmp(r['grad_n_vs_1'])} | {_cmp(r['grad_split_in_one_vs_1'])} | "
                f"{_cmp(r['grad_n_vs_split_in_one'])} | {_cmp(r.get('weights_n_vs_1'))} | "
                f"{_cmp(r.get('update_n_vs_1'))} |"
            )
        lines.append(
            "\nNot bitwise across process counts, by design (docs/scale_out.md): each part's NVFP4 "
            "wgrad quantizes its own dY with its own per-tensor amax and stochastic-rounding draws "
            "(a sample of the gradient), and the reduce-scatter adds BF16 partial gradients in "
            "another order; the same split in ONE process, no FSDP, is as far from the 1-process "
            "gradient: the split makes the gap, not FSDP. (N vs the split in one is no closer: "
            "FSDP2's per-layer graphs name their GEMM sites from the layer, other rounding streams.)"
        )
    return "\n".join(lines) + "\n"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Multi-GPU GRPO: FSDP2 learner, engine fed NVFP4 bytes"
    )
    parser.add_argument("--nproc", type=int, default=0, help="re-run under torchrun with N ranks")
    parser.add_argument("--model", default="tiny-qwen3-moe")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=4, help="GRPO groups per step")
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompt", type=int, default=8)
    parser.add_argument("--budget", type=int, default=8)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-4, help="AdamW; BF16 weights must move")
    parser.add_argument("--engine-rank", choices=("last", "none"), default="last")
    parser.add_argument("--compare-single", action="store_true")
    parser.add_argument("--name", default="", help="results file stem")
    return parser.parse_args()
