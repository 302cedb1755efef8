"""The learner step in the step cost model (CPU, shapes only, no kernel runs): forward, backward
and AdamW of `benchmarks/learner.py`'s step (loss = logsumexp of the logits), per op and per
step: launches, bytes, FLOPs, roofline on the H200. The command over it:
`python -m benchmarks.step_cost_learner`.

The forward and backward graphs are the ones Inductor receives: Dynamo's graph through minite's
pass pipeline (`--recipe stock`: none), then aot_autograd, captured on meta tensors. The rules
of `fp4_compile/cost/rules.py` count them, plus the rules below for what they cannot see:

- A backward op of an NVFP4 GEMM launches several kernels inside its CUDA dispatch
  (`codegen/nvfp4/{linear,quantized_linear,grouped_linear}.py`, `codegen/nvfp4/gemm.py`); each is
  a row of its own (`fp4_compile/cost/learner_rules.py`), counted from the op's argument
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
  store's rewrite is priced once per optimizer step (`fp4_compile/cost/weight_store.py`,
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
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd

from ..codegen.nvfp4 import gemm
from ..passes import run_pipeline
from ..recipe import NVFP4Recipe
from .learner_rules import expand_backward
from .rollout import expert_fraction
from .rules import OpCost, step_costs
from .summary import by_op, constants, summarize
from .weight_store import FORMS, learner_store, refresh_rows

ADAMW_TENSORS_PER_LAUNCH = 100  # estimate (multi_tensor_apply chunks), not measured


def learner_graphs(model: torch.nn.Module, recipe: str, *, batch: int, seq: int, store=None):
    """(forward graph, backward graph, names of the forward's parameter placeholders) of one
    learner step of `model` (on the meta device) at [batch, seq] tokens; with `store` (a
    `WeightStore` of the model) the graphs read the weights from it, as the on_change learner's,
    and its placeholders count as parameters."""
    graphs: dict[str, fx.GraphModule] = {}
    param_positions: list[int] = []

    def keep(kind):
        def compiler(gm, example_inputs):
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
    return [
        OpCost(
            op="AdamW (fused)",
            nodes=["optimizer"],
            launches=launches,
            bytes_read=read,
            bytes_written=written,
            flops=0,
            note="launches estimated: multi_tensor_apply chunks",
        )
    ]


QUANTIZE_WEIGHTS = ("every_call", *FORMS)  # the learner's modes (and the store's earlier form)


def learner_step_cost(
    model, note: str, *, recipe: str, batch: int, seq: int, quantize_weights: str = "every_call"
) -> dict:
    """The cost model's object of one learner step (one micro-batch): forward, backward, AdamW
    and the weight quantize: in every forward (`every_call`) or the store's rewrite once per
    optimizer step (`on_change`, `weight_store.py`). `at_micro_batches` prices a step
    of several micro-batches."""
    if batch < 1 or seq < 1:
        raise ValueError(f"batch and seq must be >= 1, got {batch} and {seq}")
    if quantize_weights not in QUANTIZE_WEIGHTS:
        raise ValueError(
            f"quantize_weights must be one of {QUANTIZE_WEIGHTS}, got {quantize_weights!r}"
        )
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
    return {
        key: sum(res[p][key] for p in per_call) * micro_batches + sum(res[p][key] for p in once)
        for key in ("launches", "bytes", "roofline_ms")
    }
