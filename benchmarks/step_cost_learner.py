"""The learner step in the step cost model (CPU, shapes only, no kernel runs): forward, backward
and AdamW of `benchmarks/learner.py`'s step (loss = logsumexp of the logits), per op and per
step: launches, bytes, FLOPs, roofline on the H200.

    python -m benchmarks.step_cost_learner --model qwen3-30b-a3b --batch 8 --seq 512 [--json]
        [--quantize-weights every_call | on_change | "on_change, decode per call"]
    python -m benchmarks.step_cost_learner --all     # the committed table (benchmarks/results/)

The model and its rules are the library's, `fp4_compile/cost/learner.py` (the rules written out
in its docstring); this command prints them or writes the table.
"""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks.common import environment, write_results
from benchmarks.step_cost import model_arguments
from fp4_compile.cost import (
    QUANTIZE_WEIGHTS,
    at_micro_batches,
    build_model,
    constants,
    learner_step_cost,
)


def learner_text_report(res: dict) -> str:
    def line(label, s):
        return (
            f"  {label:<38} {s['launches']:>6} {s['bytes'] / 1e9:>9.3f} "
            f"{s['flops'] / 1e12:>9.3f} {s['roofline_ms']:>9.3f}"
        )

    out = [
        f"{res['model']}; recipe {res['recipe']}, quantize_weights {res['quantize_weights']}, "
        f"learner step of {res['batch']} x {res['seq']} tokens (cost model: shapes only, no "
        "kernel ran)",
        *[f"  assumption: {a}" for a in res["assumptions"]],
        f"  {'part':<38} {'launch':>6} {'GB':>9} {'TFLOP':>9} {'roof ms':>9}",
        line("forward (without weight quantize)", res["forward"]),
        line("  of which on-grid decode per call", res["ongrid_decode_per_call"]),
        line(f"weight quantize (per {res['weight_quantize_per']})", res["weight_quantize"]),
        line("backward", res["backward"]),
        line("AdamW", res["optimizer"]),
        line("step (one micro-batch)", res["step"]),
        "",
        f"{'op':<60} {'n':>4} {'launch':>6} {'MB':>10} {'GFLOP':>9} {'roof us':>9}",
    ]
    for a in res["by_op"][:25]:
        out.append(
            f"{a['op'][:60]:<60} {a['count']:>4} {a['launches']:>6} "
            f"{a['bytes'] / 1e6:>10.2f} {a['flops'] / 1e9:>9.2f} {a['roofline_us']:>9.1f}"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(parser, batch=8)
    parser.add_argument("--seq", type=int, default=512, help="tokens per sequence")
    parser.add_argument(
        "--quantize-weights",
        choices=QUANTIZE_WEIGHTS,
        default="every_call",
        help="the learner's weight quantize: in every forward, or once per "
        "optimizer step from the weight store",
    )
    args = parser.parse_args(argv)
    if args.all:
        for path in write_learner_table():
            print(path)
        return
    if not args.model:
        parser.error("--model is required (or --all)")
    model, note = build_model(args.model, layers=args.layers)
    res = learner_step_cost(
        model,
        note,
        recipe=args.recipe,
        batch=args.batch,
        seq=args.seq,
        quantize_weights=args.quantize_weights,
    )
    if args.json:
        json.dump(res, sys.stdout, indent=1)
        print()
    else:
        print(learner_text_report(res))


# the measured steps beside the model: benchmarks/learner.py on the H200, CUDA-graph rows
MEASURED = "benchmarks/results/2026-12-06_learner_364bfcf.md"
MEASURED_MS = {"strict": 22.2, "stock": 18.2}


def _share(roofline_ms: float, measured_ms: float | None) -> str:
    return f"{roofline_ms / measured_ms:.0%}" if measured_ms else "-"


MICRO_BATCHES = (1, 2, 4, 8)  # gradient accumulation: forward + backward passes per step


def _weight_work(res: dict, micro_batches: int) -> tuple[int, float, float]:
    """(launches, GB, roofline ms) of the weight quantize and the on-grid decodes per optimizer
    step of `micro_batches` passes."""
    q, d = res["weight_quantize"], res["ongrid_decode_per_call"]
    times = micro_batches if res["weight_quantize_per"] == "micro-batch" else 1
    return (
        q["launches"] * times + d["launches"] * micro_batches,
        (q["bytes"] * times + d["bytes"] * micro_batches) / 1e9,
        q["roofline_ms"] * times + d["roofline_ms"] * micro_batches,
    )


def write_learner_table(batch: int = 8, seq: int = 512) -> list:
    env = environment()
    runs = []
    md = [
        f"# Learner step cost model, commit {env['commit']}, torch {env['torch']}",
        "",
        "Cost-model figures: computed on the CPU from the forward and backward graphs Inductor "
        "receives (meta tensors); no kernel ran. Rules: `fp4_compile/cost/rules.py`, "
        "`fp4_compile/cost/learner.py` and `fp4_compile/cost/weight_store.py`; regenerate "
        "with `python -m benchmarks.step_cost_learner --all`. Roofline on the H200 as the rollout "
        f"table (copy {constants()['copy_bytes_per_s'] / 1e12:.3f} TB/s, BF16 "
        f"{constants()['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s). Measured: `{MEASURED}` "
        "(H200, CUDA graphs; stock = torch.compile Inductor BF16).",
        "",
        f"Step of `benchmarks/learner.py`: {batch} x {seq} tokens per micro-batch, loss = "
        "logsumexp of the logits, AdamW. Weight quantize: `every_call` runs it in every forward "
        '(each micro-batch); `quantize_weights="on_change"` rewrites the weight store once per '
        "optimizer step (its rows: the store's writes); `on_change, decode per call` is the "
        "store before it held the on-grid copies (the forward decoded them in every call). "
        "The experts' weights quantize in two steps on sm_90 (row maxima, a read of W, then the "
        "codes); `on_change, row maxima from the optimizer (not built)` is a what-if: an AdamW "
        "that emits the row maxima as it writes the expert weights, so the refresh skips that "
        "read.",
    ]
    model, note = build_model("qwen3-30b-a3b")
    md += [
        "",
        note,
        "",
        "| recipe | quantize_weights | launches | GB | TFLOP | roofline ms | forward ms (of "
        "which decode) | weight quantize ms (GB), per | backward ms | AdamW ms | roofline ms "
        "at 4 micro-batches | measured ms | roofline / measured |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    configs = [("strict", m) for m in QUANTIZE_WEIGHTS] + [
        ("bf16", "every_call"),
        ("stock", "every_call"),
    ]
    for recipe, mode in configs:
        res = learner_step_cost(
            model, note, recipe=recipe, batch=batch, seq=seq, quantize_weights=mode
        )
        s, q, f = res["step"], res["weight_quantize"], res["forward"]
        ms = MEASURED_MS.get(recipe) if mode == "every_call" else None
        md.append(
            f"| {recipe} | {mode if recipe != 'stock' else '-'} | {s['launches']} | "
            f"{s['bytes'] / 1e9:.2f} | {s['flops'] / 1e12:.2f} | {s['roofline_ms']:.2f} | "
            f"{f['roofline_ms']:.2f} ({res['ongrid_decode_per_call']['roofline_ms']:.2f}) | "
            f"{q['roofline_ms']:.2f} ({q['bytes'] / 1e9:.2f}), {res['weight_quantize_per']} | "
            f"{res['backward']['roofline_ms']:.2f} | {res['optimizer']['roofline_ms']:.2f} | "
            f"{at_micro_batches(res, 4)['roofline_ms']:.2f} | {ms if ms else '-'} | "
            f"{_share(s['roofline_ms'], ms)} |"
        )
        runs.append(res)
    strict = {r["quantize_weights"]: r for r in runs if r["recipe"] == "strict"}
    md += [
        "",
        "Weight work of the strict step per optimizer step (weight quantize and on-grid "
        "decodes: launches / GB / roofline ms) by micro-batches per step:",
        "",
        "| quantize_weights | "
        + " | ".join(f"{m} micro-batch{'es' if m > 1 else ''}" for m in MICRO_BATCHES)
        + " |",
        "| --- |" + " --- |" * len(MICRO_BATCHES),
    ]
    for mode, res in strict.items():
        cells = [
            f"{n} / {gb:.2f} / {t:.2f}"
            for n, gb, t in (_weight_work(res, m) for m in MICRO_BATCHES)
        ]
        md.append(f"| {mode} | " + " | ".join(cells) + " |")
    for mode in ("every_call", "on_change"):
        md += [
            "",
            f"Top ops of the strict step ({mode}) by bytes:",
            "",
            "| op | calls | launches | MB | GFLOP | roofline us |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for a in strict[mode]["by_op"][:12]:
            md.append(
                f"| `{a['op']}` | {a['count']} | {a['launches']} | {a['bytes'] / 1e6:.0f} | "
                f"{a['flops'] / 1e9:.1f} | {a['roofline_us']:.0f} |"
            )
    payload = {"env": env, "constants": constants(), "batch": batch, "seq": seq, "runs": runs}
    return write_results("step_cost_learner", payload, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
