"""The learner step in the step cost model (CPU, shapes only, no kernel runs): forward, backward
and AdamW of `benchmarks/learner.py`'s step (loss = logsumexp of the logits), per op and per
step: launches, bytes, FLOPs, roofline on the H200.

    python -m benchmarks.step_cost_learner --model qwen3-30b-a3b --batch 8 --seq 512 [--json]
        [--quantize-weights every_call | on_change | "on_change, decode per call"]
    python -m benchmarks.step_cost_learner --all     # the committed table (benchmarks/results/)

The forward and backward graphs are the ones Inductor receives: Dynamo's graph through minite's
pass pipeline (`--recipe stock`: none), then aot_autograd, captured on meta tensors. The rules
of `benchmarks/step_cost_rules.py` count them, plus the rules below for what they cannot see:

- A backward op of an NVFP4 GEMM launches several kernels inside its CUDA dispatch
  (`codegen/nvfp4/{linear,quantized_linear,grouped_linear}.py`, `codegen/nvfp4/gemm.py`); each is
  a row of its own (`benchmarks/step_cost_learner_rules.py`), counted from the op's argument
  shapes: dY's per-tensor amax, dY quantized to an on-grid BF16 copy, the weight's on-grid copy
  (read when the forward kept it, else dequantized), the dgrad GEMM, dY^T and X^T quantized
  (X^T given when the forward shared its quantize), the wgrad GEMM; a BF16 dgrad / wgrad is one
  GEMM. The grouped wgrad (`grouped_wgrad_kernel.py`) adds its segment layout and amaxes.
- The graphs are lowered as for CUDA: a weight whose forward sees >= `ONGRID_FORWARD_MIN_ROWS`
  rows is quantized with its on-grid BF16 copy once per step (`quantize_with_ongrid`), which
  the forward and the dgrad read.
- Weight quantizes (`fp4_compile::quantize[_with_ongrid]` / `weight_group_amax` of a parameter)
  are listed apart: `every_call` runs them in every forward (each micro-batch). `on_change`
  (`fp4_compile.compile(quantize_weights="on_change")`): the graphs are bound to a weight store
  as the learner's are (they read its tensors, no weight quantize left in them) and the
  store's rewrite is priced once per optimizer step (`benchmarks/step_cost_weight_store.py`,
  with the store's earlier form, which decoded the on-grid copies in every forward).
  `at_micro_batches` prices a step of several forward + backward passes.
- AdamW (torch's fused kernel): per parameter, reads the parameter, its gradient and the two
  FP32 moments, writes the parameter and the moments; one launch per 100 tensors (an estimate
  of multi_tensor_apply's chunking, marked as such).
"""

from __future__ import annotations

from unittest import mock

import torch
import torch.fx as fx

from benchmarks.step_cost_learner_rules import expand_backward
from benchmarks.step_cost_rules import OpCost, step_costs
from benchmarks.step_cost_weight_store import FORMS, learner_store, refresh_rows

ADAMW_TENSORS_PER_LAUNCH = 100  # estimate (multi_tensor_apply chunks), not measured


def learner_graphs(model: torch.nn.Module, recipe: str, *, batch: int, seq: int, store=None):
    """(forward graph, backward graph, names of the forward's parameter placeholders) of one
    learner step of `model` (on the meta device) at [batch, seq] tokens; with `store` (a
    `WeightStore` of the model) the graphs read the weights from it, as the on_change learner's,
    and its placeholders count as parameters."""
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
        extra = ()
        if store is not None:
            gm, example_inputs, extra = store.bind_dynamo_graph(gm, example_inputs)
            count = sum(1 for n in gm.graph.nodes if n.op == "placeholder")
            param_positions.extend(range(count - len(extra), count))
        fn = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"))(
            gm, example_inputs
        )
        return (lambda *args: fn(*args, *extra)) if extra else fn

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


def adamw_rows(model: torch.nn.Module) -> list[OpCost]:
    """torch's fused AdamW over the model's parameters (see the module docstring)."""
    params = list(model.parameters())
    read = sum(p.numel() * (2 * p.element_size() + 8) for p in params)
    written = sum(p.numel() * (p.element_size() + 8) for p in params)
    launches = -(-len(params) // ADAMW_TENSORS_PER_LAUNCH)
    return [OpCost(op="AdamW (fused)", nodes=["optimizer"], launches=launches, bytes_read=read,
                   bytes_written=written, flops=0,
                   note="launches estimated: multi_tensor_apply chunks")]  # fmt: skip


QUANTIZE_WEIGHTS = ("every_call", *FORMS)  # the learner's modes (and the store's earlier form)


def learner_step_cost(model, note: str, *, recipe: str, batch: int, seq: int,
                      quantize_weights: str = "every_call") -> dict:  # fmt: skip
    """The cost model's object of one learner step (one micro-batch): forward, backward, AdamW
    and the weight quantize: in every forward (`every_call`) or the store's rewrite once per
    optimizer step (`on_change`, `step_cost_weight_store.py`). `at_micro_batches` prices a step
    of several micro-batches."""
    from benchmarks.step_cost import by_op, constants, expert_fraction, summarize

    if batch < 1 or seq < 1:
        raise ValueError(f"batch and seq must be >= 1, got {batch} and {seq}")
    if quantize_weights not in QUANTIZE_WEIGHTS:
        raise ValueError(f"quantize_weights must be one of {QUANTIZE_WEIGHTS}, got "
                         f"{quantize_weights!r}")  # fmt: skip
    store = None if quantize_weights == "every_call" else learner_store(model, quantize_weights)
    fw, bw, params = learner_graphs(model, recipe, batch=batch, seq=seq, store=store)
    frac, assumption = expert_fraction(model, batch * seq)
    shared = dict(caches=set(), context=seq, expert_fraction=frac)
    fw_rows, weight_rows = step_costs(fw, params=params, **shared)
    bw_rows, _ = step_costs(bw, params=set(), **shared)
    bw_rows = expand_backward(bw_rows, bw, frac)
    if store is not None:
        assert not weight_rows, "a weight quantize was left in a graph bound to the store"
        weight_rows = refresh_rows(store, quantize_weights)
    opt = adamw_rows(model)
    rows = fw_rows + weight_rows + bw_rows + opt
    return {
        "model": note,
        "recipe": recipe,
        "quantize_weights": quantize_weights,
        "weight_quantize_per": "micro-batch" if store is None else "optimizer step",
        "batch": batch,
        "seq": seq,
        "tokens": batch * seq,
        "assumptions": [assumption, "loss: logsumexp of the logits, as benchmarks/learner.py"],
        "step": summarize(rows),
        "forward": summarize(fw_rows),
        "weight_quantize": summarize(weight_rows),
        "ongrid_decode_per_call": summarize([r for r in fw_rows if "ongrid_weight" in r.op]),
        "backward": summarize(bw_rows),
        "optimizer": summarize(opt),
        "by_op": by_op(rows),
        "constants": constants(),
    }


def at_micro_batches(res: dict, micro_batches: int) -> dict:
    """(launches, bytes, roofline ms) of an optimizer step of `micro_batches` forward +
    backward passes of `res`'s size: the weight quantize in each (every_call) or once."""
    per_call = ["forward", "backward"]
    once = ["optimizer"]
    (per_call if res["weight_quantize_per"] == "micro-batch" else once).append("weight_quantize")
    return {key: sum(res[p][key] for p in per_call) * micro_batches
            + sum(res[p][key] for p in once)
            for key in ("launches", "bytes", "roofline_ms")}  # fmt: skip


def learner_text_report(res: dict) -> str:
    def line(label, s):
        return (f"  {label:<38} {s['launches']:>6} {s['bytes'] / 1e9:>9.3f} "
                f"{s['flops'] / 1e12:>9.3f} {s['roofline_ms']:>9.3f}")  # fmt: skip

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
    parser.add_argument("--quantize-weights", choices=QUANTIZE_WEIGHTS, default="every_call",
                        help="the learner's weight quantize: in every forward, or once per "
                        "optimizer step from the weight store")  # fmt: skip
    args = parser.parse_args(argv)
    if args.all:
        for path in write_learner_table():
            print(path)
        return
    if not args.model:
        parser.error("--model is required (or --all)")
    model, note = build_model(args.model, layers=args.layers)
    res = learner_step_cost(model, note, recipe=args.recipe, batch=args.batch, seq=args.seq,
                            quantize_weights=args.quantize_weights)  # fmt: skip
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
    return (q["launches"] * times + d["launches"] * micro_batches,
            (q["bytes"] * times + d["bytes"] * micro_batches) / 1e9,
            q["roofline_ms"] * times + d["roofline_ms"] * micro_batches)  # fmt: skip


def write_learner_table(batch: int = 8, seq: int = 512) -> list:
    from benchmarks.common import environment, write_results
    from benchmarks.step_cost import build_model, constants

    env = environment()
    runs = []
    md = [
        f"# Learner step cost model, commit {env['commit']}, torch {env['torch']}",
        "",
        "Cost-model figures: computed on the CPU from the forward and backward graphs Inductor "
        "receives (meta tensors); no kernel ran. Rules: `benchmarks/step_cost_rules.py`, "
        "`benchmarks/step_cost_learner.py` and `benchmarks/step_cost_weight_store.py`; regenerate "
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
    md += ["", note, "",
           "| recipe | quantize_weights | launches | GB | TFLOP | roofline ms | forward ms (of "
           "which decode) | weight quantize ms (GB), per | backward ms | AdamW ms | roofline ms "
           "at 4 micro-batches | measured ms | roofline / measured |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    configs = [("strict", m) for m in QUANTIZE_WEIGHTS] + [("bf16", "every_call"),
                                                          ("stock", "every_call")]  # fmt: skip
    for recipe, mode in configs:
        res = learner_step_cost(model, note, recipe=recipe, batch=batch, seq=seq,
                                quantize_weights=mode)  # fmt: skip
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
    md += ["", "Weight work of the strict step per optimizer step (weight quantize and on-grid "
           "decodes: launches / GB / roofline ms) by micro-batches per step:", "",
           "| quantize_weights | " + " | ".join(f"{m} micro-batch{'es' if m > 1 else ''}"
                                               for m in MICRO_BATCHES) + " |",
           "| --- |" + " --- |" * len(MICRO_BATCHES)]  # fmt: skip
    for mode, res in strict.items():
        cells = [f"{n} / {gb:.2f} / {t:.2f}" for n, gb, t in
                 (_weight_work(res, m) for m in MICRO_BATCHES)]  # fmt: skip
        md.append(f"| {mode} | " + " | ".join(cells) + " |")
    for mode in ("every_call", "on_change"):
        md += ["", f"Top ops of the strict step ({mode}) by bytes:", "",
               "| op | calls | launches | MB | GFLOP | roofline us |",
               "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for a in strict[mode]["by_op"][:12]:
            md.append(f"| `{a['op']}` | {a['count']} | {a['launches']} | {a['bytes'] / 1e6:.0f} | "
                      f"{a['flops'] / 1e9:.1f} | {a['roofline_us']:.0f} |")  # fmt: skip
    payload = {"env": env, "constants": constants(), "batch": batch, "seq": seq, "runs": runs}
    return write_results("step_cost_learner", payload, "\n".join(md) + "\n")


if __name__ == "__main__":
    main()
