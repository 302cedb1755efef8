"""The committed tables of the step cost model (`python -m benchmarks.step_cost --all`): both
benchmark models x batch 1 / 16 / 64 / 256 x recipes strict / bf16 / stock at context 512 (the
rollout benchmark's cache: prompt 256 + 256 new tokens = 512 slots), written as
benchmarks/results/<date>_step_cost_<commit>.{md,json}."""

from __future__ import annotations

import platform

from benchmarks.common import environment, write_results
from benchmarks.step_cost import BUILTIN_NOTES, RECIPES, build_model, constants, step_cost

BATCHES = (1, 16, 64, 256)
CONTEXT = 512


def _short_op(op: str) -> str:
    return op.removeprefix("fp4_compile.").removeprefix("aten.")


def _top5(res: dict) -> str:
    return "; ".join(f"{_short_op(a['op'])} x{a['count']} {a['bytes'] / 1e6:.0f}"
                     for a in res["by_op"][:5])  # fmt: skip


def _row(res: dict) -> str:
    pre = res["prefill"]
    return (
        f"| {res['recipe']} | {res['batch']} | {res['launches']} ({res['launches_eager']}) | "
        f"{res['bytes'] / 1e6:.1f} | {res['kv_cache_copy_bytes'] / 1e6:.1f} | "
        f"{res['flops'] / 1e9:.2f} | {res['roofline_ms'] * 1e3:.1f} | "
        f"{pre['launches']} | {pre['bytes'] / 1e6:.0f} | {pre['roofline_ms']:.2f} | {_top5(res)} |"
    )


def write_all(batches=BATCHES, context: int = CONTEXT) -> list:
    import torch

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
        "Rules: `benchmarks/step_cost_rules.py`; guide: docs/step_cost.md. Regenerate with "
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
        md += ["", f"## {spec}", "", note, "",
               "| recipe | batch | launches (eager) | MB | KV copy MB | GFLOP | roofline us | "
               "prefill launches | prefill MB | prefill roofline ms | top-5 ops by MB |",
               "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for recipe in RECIPES:
            for batch in batches:
                res = step_cost(model, note, batch=batch, context=context, recipe=recipe)
                print(f"{spec} {recipe} batch {batch}: {res['roofline_ms'] * 1e3:.1f} us",
                      flush=True)  # fmt: skip
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
