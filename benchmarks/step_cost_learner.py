"""The learner step in the step cost model (CPU, shapes only, no kernel runs): forward, backward
and AdamW of `benchmarks/learner.py`'s step (loss = logsumexp of the logits), per op and per
step: launches, bytes, FLOPs, roofline on the H200.

    python -m benchmarks.step_cost_learner --model qwen3-30b-a3b --batch 8 --seq 512 [--json]
    python -m benchmarks.step_cost_learner --all     # the committed table (benchmarks/results/)

The forward and backward graphs are the ones Inductor receives: Dynamo's graph through minite's
pass pipeline (`--recipe stock`: none), then aot_autograd, captured on meta tensors. The rules
of `benchmarks/step_cost_rules.py` count them, plus the rules below for what they cannot see:

- A backward op of an NVFP4 GEMM launches several kernels inside its CUDA dispatch
  (`codegen/nvfp4/{linear,quantized_linear,grouped_linear}.py`, `codegen/nvfp4/gemm.py`); each is
  a row of its own (`_dense_backward`, `_grouped_backward`), counted from the op's argument
  shapes: dY's per-tensor amax, dY quantized to an on-grid BF16 copy, the weight's on-grid copy
  (read when the forward kept it, else dequantized), the dgrad GEMM, dY^T and X^T quantized
  (X^T given when the forward shared its quantize), the wgrad GEMM; a BF16 dgrad / wgrad is one
  GEMM. The grouped wgrad (`grouped_wgrad_kernel.py`) adds its segment layout and amaxes.
- The graphs are lowered as for CUDA: a weight whose forward sees >= `ONGRID_FORWARD_MIN_ROWS`
  rows is quantized with its on-grid BF16 copy once per step (`quantize_with_ongrid`), which
  the forward and the dgrad read.
- Weight quantizes (`fp4_compile::quantize[_with_ongrid]` / `weight_group_amax` of a parameter) are listed
  apart: `every_call` runs them in every forward (today's learner, and each micro-batch);
  `on_change` (`fp4_compile.compile(quantize_weights="on_change")`) once per optimizer step.
- AdamW (torch's fused kernel): per parameter, reads the parameter, its gradient and the two
  FP32 moments, writes the parameter and the moments; one launch per 100 tensors (an estimate
  of multi_tensor_apply's chunking, marked as such).
"""

from __future__ import annotations

import math
from unittest import mock

import torch
import torch.fx as fx

from benchmarks.step_cost_rules import OpCost, op_name, step_costs

ADAMW_TENSORS_PER_LAUNCH = 100  # estimate (multi_tensor_apply chunks), not measured


def learner_graphs(model: torch.nn.Module, recipe: str, *, batch: int, seq: int):
    """(forward graph, backward graph, names of the forward's parameter placeholders) of one
    learner step of `model` (on the meta device) at [batch, seq] tokens."""
    from torch._dynamo.backends.common import aot_autograd

    from fp4_compile import NVFP4Recipe
    from fp4_compile.passes import run_pipeline

    graphs: dict[str, fx.GraphModule] = {}
    param_positions: list[int] = []

    def keep(kind):
        def compiler(gm, example_inputs):
            from functorch.compile import make_boxed_func

            graphs[kind] = gm
            return make_boxed_func(gm.forward)

        return compiler

    def backend(gm, example_inputs, **unused):
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        param_positions[:] = [i for i, n in enumerate(placeholders) if "_parameters_" in n.name]
        if recipe != "stock":
            run_pipeline(gm, getattr(NVFP4Recipe, recipe)())
        return aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))(
            gm, example_inputs
        )

    from fp4_compile.codegen.nvfp4 import gemm

    def as_on_cuda(device_type: str, rows: int) -> bool:  # meta tensors stand for CUDA ones
        return rows >= gemm.ONGRID_FORWARD_MIN_ROWS

    torch._dynamo.reset()
    model.train()
    ids = torch.zeros((batch, seq), dtype=torch.long, device="meta")
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=False)
    with mock.patch.object(gemm, "forward_uses_ongrid", as_on_cuda):
        logits = compiled(input_ids=ids, use_cache=False).logits
        logits.float().logsumexp(-1).mean().backward()
    torch._dynamo.reset()
    fw_inputs = [n for n in graphs["forward"].graph.nodes if n.op == "placeholder"]
    params = {fw_inputs[i].name for i in param_positions}
    return graphs["forward"], graphs["backward"], params


def _args(node: fx.Node) -> dict:
    """The op's arguments by schema name."""
    schema = node.target._schema
    out = {}
    for i, a in enumerate(schema.arguments):
        if i < len(node.args):
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        else:
            out[a.name] = a.default_value
    return out


def _shape(x) -> tuple[int, ...]:
    v = x.meta.get("val") if isinstance(x, fx.Node) else None
    return tuple(int(s) for s in v.shape) if isinstance(v, torch.Tensor) else ()


def _size(x) -> int:
    v = x.meta.get("val") if isinstance(x, fx.Node) else None
    return v.element_size() if isinstance(v, torch.Tensor) else 0


def _row(op, node, read, written, flops=0, note="") -> OpCost:
    return OpCost(op=op, nodes=[node.name], launches=1, bytes_read=int(read),
                  bytes_written=int(written), flops=int(flops), note=note)  # fmt: skip


def _recipe(a: dict):
    from fp4_compile.codegen.nvfp4.gemm_call import decode_recipe

    return decode_recipe(a["recipe"])


def _dense_backward(node: fx.Node) -> list[OpCost]:
    """nvfp4_linear_backward / nvfp4_linear_quantized_backward on CUDA."""
    a = _args(node)
    rec = _recipe(a)
    dy, w = a["grad_out"], a["weight"]
    n, k = _shape(w)
    m = math.prod(_shape(dy)[:-1])
    m16 = -(-m // 16) * 16
    e = _size(dy)  # BF16 (or FP32) activations and gradients; on-grid copies are BF16
    nx, nw = a["needs_x"], a["needs_w"]
    xt = a.get("xt_ongrid")
    xt_given = isinstance(xt, fx.Node) and math.prod(_shape(xt)) > 0
    name = op_name(node)
    rows = []
    per_tensor = rec.grad.global_scale == "per_tensor"
    if nx and nw and per_tensor:
        rows.append(_row(f"{name}: dY amax", node, m * n * e, 4))
    if nx:
        if rec.dgrad == "bf16":
            rows.append(_row(f"{name}: dgrad BF16 mm", node, (m * n + n * k) * 2, m * k * e,
                             2 * m * n * k))  # fmt: skip
        else:
            rows.append(_row(f"{name}: dY quantize (on-grid)", node, m * n * e, m * n * 2))
            if not isinstance(a["w_ongrid"], fx.Node):
                rows.append(_row(f"{name}: weight dequantize", node, n * k // 2 + n * k // 16,
                                 n * k * 2))  # fmt: skip
            rows.append(_row(f"{name}: dgrad GEMM", node, (m * n + n * k) * 2, m * k * e,
                             2 * m * n * k))  # fmt: skip
    if nw:
        if rec.wgrad == "bf16":
            rows.append(_row(f"{name}: wgrad BF16 mm", node, (m * n + m * k) * 2, n * k * _size(w),
                             2 * m * n * k))  # fmt: skip
        else:
            rows.append(_row(f"{name}: dY^T quantize", node, m * n * e, n * m16 * 2))
            if not xt_given:
                rows.append(_row(f"{name}: X amax", node, m * k * e, 4))
                rows.append(_row(f"{name}: X^T quantize", node, m * k * e, k * m16 * 2))
            rows.append(_row(f"{name}: wgrad GEMM", node, (n + k) * m16 * 2, n * k * _size(w),
                             2 * m16 * n * k))  # fmt: skip
    if a.get("needs_bias"):
        rows.append(_row(f"{name}: dbias", node, m * n * e, n * 4))
    return rows


def _grouped_backward(node: fx.Node, expert_fraction: float) -> list[OpCost]:
    """nvfp4_grouped_mm_backward on CUDA (T routed rows, E experts)."""
    a = _args(node)
    rec = _recipe(a)
    dy, x, w = a["grad_out"], a["x"], a["weight"]
    experts, n, k = _shape(w)
    t = _shape(dy)[0]
    e = _size(dy)
    name = op_name(node)
    nx, nw = a["needs_x"], a["needs_w"]
    both = nx and nw and rec.dgrad == rec.wgrad == "nvfp4" and rec.grad.global_scale == "per_tensor"
    wbytes = int(experts * n * k * expert_fraction)  # the experts' elements a step touches
    rows = []
    if both:
        rows.append(_row(f"{name}: dY row maxima", node, t * n * e, t * 4))
        rows.append(_row(f"{name}: dY amax", node, t * 4, 4))
    if nx:
        if rec.dgrad == "bf16":
            rows.append(_row(f"{name}: dgrad BF16 per expert", node, (t * n + wbytes) * 2,
                             t * k * e, 2 * t * n * k))  # fmt: skip
        else:
            rows.append(_row(f"{name}: dY quantize (on-grid)", node, t * n * e, t * n * 2))
            if not isinstance(a["w_ongrid"], fx.Node):
                rows.append(_row(f"{name}: weight dequantize", node, wbytes // 2 + wbytes // 16,
                                 wbytes * 2))  # fmt: skip
            rows.append(_row(f"{name}: dgrad grouped GEMM", node, t * n * 2 + wbytes * 2,
                             t * k * e, 2 * t * n * k))  # fmt: skip
        if isinstance(a.get("x_index"), fx.Node):
            xr = _shape(x)[0]
            rows.append(_row(f"{name}: dX scatter of gathered rows", node, t * k * e, xr * k * e))
    if nw:
        if rec.wgrad == "bf16":
            rows.append(_row(f"{name}: wgrad BF16 per expert", node, (t * n + t * k) * 2,
                             experts * n * k * _size(w), 2 * t * n * k))  # fmt: skip
        else:
            t16 = t + 16 * experts  # each expert's segment padded to 16 tokens
            rows.append(_row(f"{name}: segment layout", node, experts * 8, t * 8))
            rows.append(_row(f"{name}: dY segment amax", node, t * 4, experts * 4))
            rows.append(_row(f"{name}: dY^T segments quantize", node, t * n * e, n * t16 * 2))
            rows.append(_row(f"{name}: X row maxima", node, t * k * e, t * 4))
            rows.append(_row(f"{name}: X^T segments quantize", node, t * k * e, k * t16 * 2))
            rows.append(_row(f"{name}: wgrad grouped GEMM", node, (n + k) * t16 * 2,
                             experts * n * k * _size(w), 2 * t16 * n * k))  # fmt: skip
    return rows


def _bf16_linear_backward(node: fx.Node, expert_fraction: float) -> list[OpCost]:
    """invariant_linear_backward: the dgrad and the wgrad GEMM (BF16 operands)."""
    a = _args(node)
    dy, x, w = a["grad_y"], a["x"], a["weight"]
    n, k = _shape(w)
    m = math.prod(_shape(dy)[:-1])
    e, name = _size(dy), op_name(node)
    return [
        _row(f"{name}: dgrad", node, (m * n + n * k) * e, m * k * _size(x), 2 * m * n * k),
        _row(f"{name}: wgrad", node, (m * n + m * k) * e, n * k * _size(w), 2 * m * n * k),
    ]


def _bf16_grouped_backward(node: fx.Node, expert_fraction: float) -> list[OpCost]:
    """invariant_grouped_mm_backward: a dgrad and a wgrad GEMM per expert (host loop), FP32."""
    a = _args(node)
    dy, w = a["grad"], a["w_ENK"]
    experts, n, k = _shape(w)
    t, name = _shape(dy)[0], op_name(node)
    wb = int(experts * n * k * expert_fraction) * _size(w)
    rows = [
        _row(f"{name}: dgrad per expert", node, t * n * _size(dy) + wb, t * k * 4, 2 * t * n * k),
        _row(f"{name}: wgrad per expert", node, t * (n + k) * _size(dy), experts * n * k * 4,
             2 * t * n * k),
    ]  # fmt: skip
    for r in rows:
        r.launches = experts
    return rows


EXPANDED = {
    "fp4_compile.invariant_linear_backward": _bf16_linear_backward,
    "fp4_compile.invariant_grouped_mm_backward": _bf16_grouped_backward,
    "fp4_compile.nvfp4_linear_backward": lambda n, f: _dense_backward(n),
    "fp4_compile.nvfp4_linear_quantized_backward": lambda n, f: _dense_backward(n),
    "fp4_compile.nvfp4_grouped_mm_backward": _grouped_backward,
}


def _expand(rows: list[OpCost], gm: fx.GraphModule, expert_fraction: float) -> list[OpCost]:
    """The rows with each composite backward op replaced by its kernels (on CUDA)."""
    by_name = {n.name: n for n in gm.graph.nodes}
    out = []
    for r in rows:
        expand = EXPANDED.get(r.op)
        out.extend(expand(by_name[r.nodes[0]], expert_fraction) if expand else [r])
    return out


def adamw_rows(model: torch.nn.Module) -> list[OpCost]:
    """torch's fused AdamW over the model's parameters (see the module docstring)."""
    params = list(model.parameters())
    read = sum(p.numel() * (2 * p.element_size() + 8) for p in params)
    written = sum(p.numel() * (p.element_size() + 8) for p in params)
    launches = -(-len(params) // ADAMW_TENSORS_PER_LAUNCH)
    return [OpCost(op="AdamW (fused)", nodes=["optimizer"], launches=launches, bytes_read=read,
                   bytes_written=written, flops=0,
                   note="launches estimated: multi_tensor_apply chunks")]  # fmt: skip


def learner_step_cost(model, note: str, *, recipe: str, batch: int, seq: int) -> dict:
    """The cost model's object of one learner step: forward, backward, AdamW, and the weight
    quantizes per call and per version."""
    from benchmarks.step_cost import by_op, constants, expert_fraction, summarize

    if batch < 1 or seq < 1:
        raise ValueError(f"batch and seq must be >= 1, got {batch} and {seq}")
    fw, bw, params = learner_graphs(model, recipe, batch=batch, seq=seq)
    frac, assumption = expert_fraction(model, batch * seq)
    shared = dict(caches=set(), context=seq, expert_fraction=frac)
    fw_rows, weight_rows = step_costs(fw, params=params, **shared)
    bw_rows, _ = step_costs(bw, params=set(), **shared)
    bw_rows = _expand(bw_rows, bw, frac)
    opt = adamw_rows(model)
    every_call = fw_rows + weight_rows + bw_rows + opt  # on_change: weight_rows once per step
    return {
        "model": note,
        "recipe": recipe,
        "batch": batch,
        "seq": seq,
        "tokens": batch * seq,
        "assumptions": [assumption, "loss: logsumexp of the logits, as benchmarks/learner.py"],
        "step": summarize(every_call),
        "forward": summarize(fw_rows),
        "weight_quantize": summarize(weight_rows),
        "backward": summarize(bw_rows),
        "optimizer": summarize(opt),
        "by_op": by_op(every_call),
        "constants": constants(),
    }


def learner_text_report(res: dict) -> str:
    def line(label, s):
        return (f"  {label:<34} {s['launches']:>6} {s['bytes'] / 1e9:>9.3f} "
                f"{s['flops'] / 1e12:>9.3f} {s['roofline_ms']:>9.3f}")  # fmt: skip

    out = [
        f"{res['model']}; recipe {res['recipe']}, learner step of {res['batch']} x {res['seq']} "
        "tokens (cost model: shapes only, no kernel ran)",
        *[f"  assumption: {a}" for a in res["assumptions"]],
        f"  {'part':<34} {'launch':>6} {'GB':>9} {'TFLOP':>9} {'roof ms':>9}",
        line("forward (without weight quantize)", res["forward"]),
        line("weight quantize (per forward today)", res["weight_quantize"]),
        line("backward", res["backward"]),
        line("AdamW", res["optimizer"]),
        line("step", res["step"]),
        "",
        f"{'op':<60} {'n':>4} {'launch':>6} {'MB':>10} {'GFLOP':>9} {'roof us':>9}",
    ]
    for a in res["by_op"][:25]:
        out.append(f"{a['op'][:60]:<60} {a['count']:>4} {a['launches']:>6} "
                   f"{a['bytes'] / 1e6:>10.2f} {a['flops'] / 1e9:>9.2f} {a['roofline_us']:>9.1f}")  # fmt: skip
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json
    import sys

    from benchmarks.step_cost import build_model, model_arguments

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(parser, batch=8)
    parser.add_argument("--seq", type=int, default=512, help="tokens per sequence")
    args = parser.parse_args(argv)
    if args.all:
        for path in write_learner_table():
            print(path)
        return
    if not args.model:
        parser.error("--model is required (or --all)")
    model, note = build_model(args.model, layers=args.layers)
    res = learner_step_cost(model, note, recipe=args.recipe, batch=args.batch, seq=args.seq)
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


def write_learner_table(batch: int = 8, seq: int = 512) -> list:
    from benchmarks.common import environment, write_results
    from benchmarks.step_cost import build_model, constants

    env = environment()
    runs = []
    md = [
        f"# Learner step cost model, commit {env['commit']}, torch {env['torch']}",
        "",
        "Cost-model figures: computed on the CPU from the forward and backward graphs Inductor "
        "receives (meta tensors); no kernel ran. Rules: `benchmarks/step_cost_rules.py` and "
        "`benchmarks/step_cost_learner.py`; regenerate with `python -m benchmarks.step_cost_learner "
        f"--all`. Roofline on the H200 as the rollout table "
        f"(copy {constants()['copy_bytes_per_s'] / 1e12:.3f} TB/s, BF16 "
        f"{constants()['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s). Measured: `{MEASURED}` "
        "(H200, CUDA graphs; stock = torch.compile Inductor BF16).",
        "",
        f"Step of `benchmarks/learner.py`: {batch} x {seq} tokens, loss = logsumexp of the "
        "logits, AdamW. Weight quantize: what today's learner runs in every forward (each "
        'micro-batch); with `quantize_weights="on_change"` once per optimizer step.',
    ]
    model, note = build_model("qwen3-30b-a3b")
    md += ["", note, "",
           "| recipe | launches | GB | TFLOP | roofline ms | forward ms | weight quantize ms "
           "(GB) | backward ms | AdamW ms | measured ms | roofline / measured |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for recipe in ("strict", "bf16", "stock"):
        res = learner_step_cost(model, note, recipe=recipe, batch=batch, seq=seq)
        s, q = res["step"], res["weight_quantize"]
        ms = MEASURED_MS.get(recipe)
        md.append(
            f"| {recipe} | {s['launches']} | {s['bytes'] / 1e9:.2f} | {s['flops'] / 1e12:.2f} | "
            f"{s['roofline_ms']:.2f} | {res['forward']['roofline_ms']:.2f} | "
            f"{q['roofline_ms']:.2f} ({q['bytes'] / 1e9:.2f}) | {res['backward']['roofline_ms']:.2f} | "
            f"{res['optimizer']['roofline_ms']:.2f} | {ms if ms else '-'} | "
            f"{_share(s['roofline_ms'], ms)} |"
        )
        runs.append(res)
    md += ["", "Top ops of the strict step by bytes:", "",
           "| op | calls | launches | MB | GFLOP | roofline us |", "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for a in runs[0]["by_op"][:12]:
        md.append(f"| `{a['op']}` | {a['count']} | {a['launches']} | {a['bytes'] / 1e6:.0f} | "
                  f"{a['flops'] / 1e9:.1f} | {a['roofline_us']:.0f} |")  # fmt: skip
    payload = {"env": env, "constants": constants(), "batch": batch, "seq": seq, "runs": runs}
    return write_results("step_cost_learner", payload, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
