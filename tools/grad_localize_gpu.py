"""Where do the compiled model's gradients first differ from the lowered graph run eagerly?
(issue #5: on the H200, tiny Qwen3-MoE gradients differ in 22 of 25 tensors; dense models agree.)

Records every `fp4_compile::` op of the backward of both runs (tools.op_recorder) and
reports, in backward order, each opaque op's input/output agreement and layout differences:
- inputs differ -> a traced (Inductor-generated) op upstream computed them differently;
- inputs equal, outputs differ -> the op itself (its kernels follow strides / alignment).

    python -m tools.grad_localize_gpu [--cpu] [--recipes strict,bf16]

A diagnostic tool: its pass/fail part (every gradient == the eager lowered graph's, bitwise) is
tests/gpu/test_gpu_backend.py.
"""

from __future__ import annotations

import argparse
import copy

import torch

import fp4_compile.codegen  # noqa: F401  (registers the ops)
from benchmarks.common import environment, write_results
from fp4_compile import NVFP4Recipe
from fp4_compile.backend import lowering_only_backend
from fp4_compile.models import qwen3_30b_a3b_layers, tiny_llama, tiny_qwen3_moe
from fp4_compile.sr_stream import set_sr_state
from tools.op_recorder import OpRecorder, compare_runs, first_culprit

MODELS = {
    "moe": ("tiny Qwen3-MoE (bf16)", lambda: tiny_qwen3_moe(layers=2, dtype=torch.bfloat16)),
    "llama": ("tiny Llama (fp32)", lambda: tiny_llama()),
    # the backend check's 30B-shaped rows: 2 x 128 tokens
    "30b": ("Qwen3-30B-A3B-shaped x2 (bf16)", lambda: qwen3_30b_a3b_layers(layers=2)),
    # the same at the backend check's --tokens 4096 (32 x 128 tokens)
    "30b4k": (
        "Qwen3-30B-A3B-shaped x2 (bf16), 4096 tokens",
        lambda: qwen3_30b_a3b_layers(layers=2),
    ),
}
TOKENS = {"30b": (2, 128), "30b4k": (32, 128)}
PRESETS = {"strict": NVFP4Recipe.strict, "te": NVFP4Recipe.te, "bf16": NVFP4Recipe.bf16}


def _backward_calls(model, backend, ids, **kw):
    torch._dynamo.reset()
    model.zero_grad(set_to_none=True)
    set_sr_state(None)
    compiled = torch.compile(model, backend=backend, fullgraph=True, **kw)
    loss = compiled(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean()
    with OpRecorder() as rec:
        loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return rec.calls, grads


def _grad_diffs(a: dict, b: dict) -> list[dict]:
    rows = []
    for name, ga in a.items():
        gb = b[name]
        differ = (
            (ga.view(torch.int16) != gb.view(torch.int16))
            if ga.dtype == torch.bfloat16
            else (ga != gb)
        )
        if differ.any():
            d = (ga.float() - gb.float()).abs()
            rows.append(
                {
                    "param": name,
                    "elements_differ": int(differ.sum()),
                    "numel": ga.numel(),
                    "max_abs_diff": float(d.max()),
                }
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu", action="store_true", help="smoke run on the CPU")
    parser.add_argument("--recipes", default="strict,bf16")
    parser.add_argument("--models", default="moe", help="comma list of: " + ",".join(MODELS))
    args = parser.parse_args()
    dev = "cpu" if args.cpu else "cuda"
    env = environment()
    md = [
        f"# backward op-by-op: compiled vs eager lowered, {env.get('gpu', dev)}, torch "
        f"{env['torch']}, commit {env['commit']} (emulated NVFP4 on sm_90)",
        "",
    ]
    payload = {"env": env, "runs": {}}
    runs = [(m, r) for m in args.models.split(",") for r in args.recipes.split(",")]
    for model_key, recipe_name in runs:
        title, build = MODELS[model_key]
        name = f"{title}, {recipe_name}"
        recipe = PRESETS[recipe_name]()
        torch.manual_seed(0)
        model = build().to(dev)
        twin = copy.deepcopy(model)
        ids = torch.randint(0, 100, TOKENS.get(model_key, (3, 24)), device=dev)
        eager, eager_grads = _backward_calls(twin, lowering_only_backend(recipe), ids)
        compiled, grads = _backward_calls(model, "minite", ids, options={"recipe": recipe})
        rows = compare_runs(eager, compiled)
        culprit = first_culprit(rows)
        grad_rows = _grad_diffs(eager_grads, grads)
        payload["runs"][name] = {"rows": rows, "first_culprit": culprit, "grads": grad_rows}
        md += [
            f"## {name}",
            f"first op with equal inputs and different outputs: "
            f"{culprit['key'] if culprit else 'none'}",
            "",
            "| # | op | paired | inputs equal (differing) | outputs equal | layouts equal |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for i, r in enumerate(rows):
            md.append(
                f"| {i} | `{r['op'].removeprefix('fp4_compile.')}` | {r['paired']} | "
                f"{r.get('inputs_equal', '')} {r.get('differing_inputs', '')} | "
                f"{r.get('outputs_equal', '')} | {r.get('layouts_equal', '')} |"
            )
        md += ["", "layouts that differ (eager lowered | compiled):"]
        for i, r in enumerate(rows):
            if r.get("layouts"):
                md += [
                    f"- #{i} `{r['op'].removeprefix('fp4_compile.')}`: "
                    + "; ".join(
                        f"in{j}: {x} | {y}" for j, (x, y) in enumerate(zip(*r["layouts"])) if x != y
                    )
                ]
        md += ["", f"parameter gradients that differ: {len(grad_rows)} of {len(grads)}"]
        md += [
            f"- `{g['param']}`: {g['elements_differ']}/{g['numel']} elements, max |d| "
            f"{g['max_abs_diff']:.3g}"
            for g in grad_rows
        ]
        md.append("")
    text = "\n".join(md) + "\n"
    print(text)
    write_results("grad_localize_cpu_smoke" if args.cpu else "grad_localize_gpu", payload, text)


if __name__ == "__main__":
    main()
