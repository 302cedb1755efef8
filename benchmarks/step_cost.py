"""The rollout step cost model (CPU, shapes only, no kernel runs): per op and per step, kernel
launches, bytes read and written, FLOPs and roofline time on the H200, from the lowered prefill
and decode graphs.

    python -m benchmarks.step_cost --model qwen3-30b-a3b --batch 64 --context 512 --recipe strict
    python -m benchmarks.step_cost --model path/to/config.json --batch 1 --context 512 --json
    python -m benchmarks.step_cost --all          # the committed tables (benchmarks/results/)
    python -m benchmarks.step_cost --model qwen3-8b --batch 64 --context 512 --launches --json

The learner step (forward + backward + AdamW): `python -m benchmarks.step_cost_learner`. The
model and its counting rules are the library's, `fp4_compile.cost` (the rules written out in
`fp4_compile/cost/rollout.py`'s docstring); this command prints them or writes the tables.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys

import torch

from benchmarks.common import environment, write_results
from fp4_compile.cost import BUILTIN_NOTES, RECIPES, build_model, constants, step_cost
from fp4_compile.cost.launches import launch_budget


def text_report(res: dict) -> str:
    out = [
        f"{res['model']}; recipe {res['recipe']}, batch {res['batch']}, context {res['context']} "
        f"of {res['max_seq_len']} cache slots (cost model: shapes only, no kernel ran)",
        *[f"  assumption: {a}" for a in res["assumptions"]],
        f"decode step: {res['launches']} launches ({res['launches_eager']} eager), "
        f"{res['bytes'] / 1e6:.2f} MB, {res['flops'] / 1e9:.2f} GFLOP, roofline "
        f"{res['roofline_ms'] * 1e3:.1f} us; KV-cache copies {res['kv_cache_copy_bytes'] / 1e6:.2f} MB",
        f"prefill ({res['context']} tokens/seq): {res['prefill']['launches']} launches, "
        f"{res['prefill']['bytes'] / 1e6:.1f} MB, roofline {res['prefill']['roofline_ms']:.3f} ms",
        "",
        f"{'op':<48} {'n':>4} {'launch':>6} {'MB':>9} {'GFLOP':>8} {'roof us':>8}  kv cache",
    ]
    for a in res["by_op"]:
        out.append(
            f"{a['op'][:48]:<48} {a['count']:>4} {a['launches']:>6} "
            f"{a['bytes'] / 1e6:>9.3f} {a['flops'] / 1e9:>8.3f} "
            f"{a['roofline_us']:>8.2f}  {a['kv_cache']}"
        )
    return "\n".join(out)


# The committed tables (`--all`): both benchmark models x batch 1 / 16 / 64 / 256 x recipes
# strict / bf16 / stock at context 512 (the rollout benchmark's cache: prompt 256 + 256 new
# tokens = 512 slots), written as benchmarks/results/<date>_step_cost_<commit>.{md,json}.
REPORT_BATCHES = (1, 16, 64, 256)
REPORT_CONTEXT = 512


def _short_op(op: str) -> str:
    return op.removeprefix("fp4_compile.").removeprefix("aten.")


def _top5(res: dict) -> str:
    return "; ".join(
        f"{_short_op(a['op'])} x{a['count']} {a['bytes'] / 1e6:.0f}" for a in res["by_op"][:5]
    )


def _row(res: dict) -> str:
    pre = res["prefill"]
    return (
        f"| {res['recipe']} | {res['batch']} | {res['launches']} ({res['launches_eager']}) | "
        f"{res['bytes'] / 1e6:.1f} | {res['kv_cache_copy_bytes'] / 1e6:.1f} | "
        f"{res['flops'] / 1e9:.2f} | {res['roofline_ms'] * 1e3:.1f} | "
        f"{pre['launches']} | {pre['bytes'] / 1e6:.0f} | {pre['roofline_ms']:.2f} | {_top5(res)} |"
    )


def write_all(batches=REPORT_BATCHES, context: int = REPORT_CONTEXT) -> list:
    env = environment()
    env["python"] = platform.python_version()
    runs, md = [], []
    md += [
        f"# Rollout step cost model, commit {env['commit']}, torch {env['torch']}",
        "",
        "Cost-model figures: computed on the CPU from the lowered graphs' shapes (meta tensors); "
        "no kernel ran. Roofline on the H200: max(bytes / copy rate, FLOPs / BF16 peak) per op, "
        f"summed; copy rate {constants()['copy_bytes_per_s'] / 1e12:.3f} TB/s "
        f"(`{constants()['copy_source']}`), BF16 peak "
        f"{constants()['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s (`{constants()['bf16_source']}`). "
        "Rules: `fp4_compile/cost/rules.py`; guide: docs/step_cost.md. Regenerate with "
        "`python -m benchmarks.step_cost --all`.",
        "",
        f"Decode = one new token per sequence attending to L = {context} keys in a static cache "
        f"of S = {context} slots (the rollout benchmark's: prompt 256 + 256 new tokens); "
        f"prefill = a {context}-token prompt per sequence. MoE expert weights are counted for the "
        "experts a step touches, E*(1-(1-k/E)^T) of E for T tokens (uniform routing). Quantized "
        "weights come from the engine's weight store (once per weight version, not counted).",
        "",
        "Columns: launches (eager: one per op, no fusion); MB read + written per decode step; "
        "of which KV-cache copies (transformers' repeat_kv in stock: K and V per query head over "
        "the whole static cache; none in strict / bf16, whose attention reads the KV heads in "
        "place); GFLOP; "
        "roofline us; prefill launches / MB / roofline ms; top-5 ops of the decode step by MB "
        "(xN = that many calls).",
    ]
    for spec in BUILTIN_NOTES:
        model, note = build_model(spec)
        md += [
            "",
            f"## {spec}",
            "",
            note,
            "",
            "| recipe | batch | launches (eager) | MB | KV copy MB | GFLOP | roofline us | "
            "prefill launches | prefill MB | prefill roofline ms | top-5 ops by MB |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for recipe in RECIPES:
            for batch in batches:
                res = step_cost(model, note, batch=batch, context=context, recipe=recipe)
                print(
                    f"{spec} {recipe} batch {batch}: {res['roofline_ms'] * 1e3:.1f} us", flush=True
                )
                md.append(_row(res))
                res.pop("per_op")
                runs.append({"model_name": spec, **res})
        for a in runs[-1]["assumptions"][:1]:
            md.append(f"\nAssumption at batch {batches[-1]}: {a}")
        del model
        torch._dynamo.reset()
    md.append("")
    md.append(
        "Per-op rows (every kernel, its bytes, FLOPs, and whether it reads the whole static "
        "cache or the filled length): `python -m benchmarks.step_cost --model NAME --batch B "
        "--context 512 --recipe R --json`."
    )
    payload = {"env": env, "constants": constants(), "context": context, "runs": runs}
    return write_results("step_cost", payload, "\n".join(md) + "\n")


def launches_report(res: dict) -> str:
    """The launch budget in words (`fp4_compile/cost/launches.py`)."""
    budget = res["budget"]
    lines = [
        f"{res['model']}; recipe {res['recipe']}, batch {res['batch']}, context {res['context']}",
        f"launches per layer: {res['launches_per_layer']} (budget {budget['per_layer']})",
        f"launches outside the layers: {res['launches_outside_layers']} (budget "
        f"{budget['outside_layers']}): {res['launches_outside_compiled']} in the compiled step, "
        f"{res['launches_eager']} eager ({res['sampling']})",
        f"budget met: {'yes' if res['budget_met'] else 'no'}",
        f"min programs per launch: {res['min_programs']}; under one program per SM: "
        f"{len(res['under_one_program_per_sm'])} launches",
        f"kv_cache_copy_bytes: {res['kv_cache_copy_bytes']}",
        "per layer: " + ", ".join(res["per_layer_kernels"]),
        "outside (compiled): " + ", ".join(res["outside_kernels"]),
        "outside (eager): " + ", ".join(res["eager_kernels"]),
    ]
    return "\n".join(lines)


def model_arguments(parser: argparse.ArgumentParser, *, batch: int) -> None:
    """The arguments the rollout and learner cost models share."""
    parser.add_argument("--model", help=f"built-in {sorted(BUILTIN_NOTES)}, config.json or folder")
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--recipe", choices=RECIPES, default="strict")
    parser.add_argument("--layers", type=int, default=None, help="override the layer count")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--all", action="store_true", help="write the committed result files")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(parser, batch=1)
    parser.add_argument("--context", type=int, default=512, help="keys per sequence (L)")
    parser.add_argument("--max-seq-len", type=int, default=None, help="cache slots (S), default L")
    parser.add_argument(
        "--launches", action="store_true", help="the decode step's launch count against its budget"
    )
    args = parser.parse_args(argv)
    if args.all:
        for path in write_all():
            print(path)
        return
    if not args.model:
        parser.error("--model is required (or --all)")
    model, note = build_model(args.model, layers=args.layers)
    if args.launches:
        res = launch_budget(model, note, recipe=args.recipe, batch=args.batch, context=args.context)
        print(json.dumps(res, indent=1) if args.json else launches_report(res))
        return
    res = step_cost(
        model,
        note,
        batch=args.batch,
        context=args.context,
        recipe=args.recipe,
        max_seq_len=args.max_seq_len,
    )
    if args.json:
        json.dump(res, sys.stdout, indent=1)
        print()
    else:
        print(text_report(res))


if __name__ == "__main__":
    main()
