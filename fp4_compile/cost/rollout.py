"""The rollout step cost model (CPU, shapes only, no kernel runs): per op and per step, kernel
launches, bytes read and written, FLOPs and roofline time on the H200, from the lowered prefill
and decode graphs. The command over it: `python -m benchmarks.step_cost`; the learner step
(forward + backward + AdamW): `fp4_compile/cost/learner.py`.

The graph is the rollout step (`fp4_compile.rollout.step.RolloutStep`) captured with
`torch.export` on meta tensors and put through the same pass pipeline and recipe as the engine
and `export_rollout` (`fp4_compile.passes.run_pipeline`); `--recipe stock` skips the pipeline
(transformers' own ATen ops, as a stock Inductor would launch them; the launches of eager
PyTorch, one per op, are `launches_eager`). Decode = one new token per sequence attending to L
(`--context`) keys in a static cache of S (`--max-seq-len`, default L) slots; prefill = a prompt
of L tokens. The counting rules (launches, Inductor fusion, bytes, MoE experts touched, KV cache
reads, roofline constants and the result files that measured them) are below and
implemented in `fp4_compile/cost/rules.py`; docs/step_cost.md is the guide.

Rules (shapes only; no kernel runs):
- No kernel: views and metadata (view, reshape of a viewable input, transpose, expand, slice,
  getitem, detach, asserts, sizes, a `to` that keeps the dtype). A reshape of an expand is a
  copy (it materializes).
- Per weight version, not per step: `fp4_compile::quantize` / `weight_group_amax` of a parameter
  (the engine's weight store holds them: `fp4_compile/rollout/weight_store.py`; listed apart, never in the step's totals).
- One launch per `fp4_compile` op, plus the launches its CUDA dispatch adds (`EXTRA_LAUNCHES`:
  the activation quantize inside `nvfp4_linear` / `nvfp4_grouped_mm`), plus one per call where an
  NVFP4 GEMM sees >= `ONGRID_FORWARD_MIN_ROWS` rows per weight and the graph gives it no on-grid
  copy (it dequantizes the packed weight each call: `codegen/nvfp4/gemm.py`).
- One launch per extern ATen kernel (`EXTERN`: GEMMs, SDPA, sort / top-k / scans / scatters).
- Every other ATen op is Inductor-fusible (pointwise or a simple reduction): a connected run of
  them that no other kernel separates (same count of kernels on their longest input path) is ONE
  launch, reading what enters the run and writing what leaves it.
- Bytes = tensor arguments read + outputs written, a view counted at min(its size, its base's).
  Not read: an NVFP4 GEMM's master weight and, in the `_quantized` forms, its high-precision x
  (the kernels read packed codes + E4M3 scales + global scales, and the on-grid activation);
  an embedding reads its output's rows of the table; a grouped (MoE) GEMM reads its weights'
  experts in the fraction a step can touch, E * (1 - (1 - k/E)^(B*Tq)) of E (uniform routing).
- KV cache: an in-place write into a cache input writes the new tokens only; attention reads
  the filled length (L) when the graph tells the kernel where each row's keys end (a length
  tensor or a mask: the kernel stops at the block holding a row's last visible key), the whole
  static cache (S) otherwise; an op other than attention that reads a cache and writes at least
  a cache layer's bytes is a copy of the cache (`copies_kv_cache`).
- FLOPs: GEMMs 2*M*N*K, attention 4*B*H*Tq*keys*D; other ops 0.
- Roofline per row: max(bytes / COPY_BYTES_PER_S, flops / BF16_FLOPS_PER_S); a step's is the sum.
"""

from __future__ import annotations

import torch

from ..passes import run_pipeline
from ..recipe import NVFP4Recipe
from ..rollout.step import RolloutStep
from .models import model_config
from .rules import step_costs
from .summary import by_op, constants, summarize

RECIPES = ("strict", "bf16", "stock")


def step_inputs(model, *, batch: int, tokens: int, context: int, max_seq_len: int) -> tuple:
    """Meta inputs of the rollout step: ids / positions [B, Tq] (the last Tq of L positions),
    kv lengths [B], and k_0, v_0, ... [B, H_kv, S, D]."""
    cfg = model_config(model)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    meta = dict(device="meta")
    ids = torch.zeros((batch, tokens), dtype=torch.long, **meta)
    pos = torch.zeros((batch, tokens), dtype=torch.long, **meta)
    kv_len = torch.full((batch,), context, dtype=torch.long, **meta)
    shape = (batch, cfg.num_key_value_heads, max_seq_len, head_dim)
    caches = [
        torch.zeros(shape, dtype=torch.bfloat16, **meta) for _ in range(2 * cfg.num_hidden_layers)
    ]
    return (ids, pos, kv_len, *caches)


def lowered_step(model, recipe: str, *, batch: int, tokens: int, context: int, max_seq_len: int):
    """The rollout step's ExportedProgram at these static shapes, through minite's pass pipeline
    with `recipe` ("strict", "bf16"), or as transformers' own ops ("stock")."""
    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    example = step_inputs(
        model, batch=batch, tokens=tokens, context=context, max_seq_len=max_seq_len
    )
    with torch.no_grad():
        program = torch.export.export(RolloutStep(model).eval(), example, strict=False)
        if recipe != "stock":
            run_pipeline(program.graph_module, getattr(NVFP4Recipe, recipe)())
    return program


def expert_fraction(model, tokens: int) -> tuple[float, str]:
    """(expected fraction of experts a step of `tokens` tokens touches, the assumption in words)."""
    cfg = model_config(model)
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    if not experts:
        return 1.0, "dense model: every weight is read"
    k = cfg.num_experts_per_tok
    touched = experts * (1 - (1 - k / experts) ** tokens)
    return touched / experts, (
        f"MoE: {tokens} tokens x top-{k} of {experts} experts, uniform independent routing: "
        f"E*(1-(1-k/E)^T) = {touched:.1f} experts touched per layer; expert weights counted "
        "for those only"
    )


def phase_cost(model, recipe: str, *, batch: int, tokens: int, context: int, max_seq_len: int):
    program = lowered_step(
        model, recipe, batch=batch, tokens=tokens, context=context, max_seq_len=max_seq_len
    )
    sig = program.graph_signature
    frac, assumption = expert_fraction(model, batch * tokens)
    rows, per_version = step_costs(
        program.graph_module,
        params=set(sig.inputs_to_parameters),
        caches=set(sig.user_inputs[3:]),
        context=context,
        expert_fraction=frac,
    )
    return rows, per_version, assumption


def step_cost(
    model, note: str, *, batch: int, context: int, recipe: str, max_seq_len: int | None = None
) -> dict:
    """The cost model's object for one (model, batch, context, recipe): the decode step's totals
    and rows, the prefill's totals, the work done once per weight version."""
    if batch < 1 or context < 1:
        raise ValueError(f"batch and context must be >= 1, got {batch} and {context}")
    slots = context if max_seq_len is None else max_seq_len
    if slots < context:
        raise ValueError(f"max_seq_len ({slots}) must be >= context ({context})")
    shapes = dict(batch=batch, context=context, max_seq_len=slots)
    rows, per_version, assumption = phase_cost(model, recipe, tokens=1, **shapes)
    pre_rows, _, pre_assumption = phase_cost(model, recipe, tokens=context, **shapes)
    return {
        "model": note,
        "recipe": recipe,
        "batch": batch,
        "context": context,
        "max_seq_len": slots,
        **summarize(rows),
        "assumptions": [assumption, "decode: 1 new token per sequence, L = context keys"],
        "per_op": [r.to_dict() for r in rows],
        "by_op": by_op(rows),
        "prefill": {
            **summarize(pre_rows),
            "tokens_per_sequence": context,
            "assumption": pre_assumption,
            "by_op": by_op(pre_rows)[:5],
        },
        "per_weight_version": summarize(per_version),
        "constants": constants(),
    }
