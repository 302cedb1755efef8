"""FX graph passes of the `minite` backend, imported as `fp4_compile.passes`.

One pass per file; PIPELINE is the order. Each pass takes (graph module, recipe, report), edits
the graph in place and keeps node.meta (including "val"/"example_value") on the nodes it
creates. The same pipeline runs on Dynamo graphs (torch.compile) and on exported graphs.
Import siblings relatively; never import `rl`.
"""

from __future__ import annotations

import torch.fx as fx

from ..recipe import NVFP4Recipe
from .attach_combine_inverse import attach_combine_inverse
from .bind_weight_inputs import (
    QuantizeSpec,
    SiteReads,
    bind_weight_inputs,
    site_reads,
    weight_quantize_sites,
)
from .defer_decode_codes import defer_decode_codes
from .drop_ongrid_weights import drop_ongrid_weights
from .emit_attention_parts import emit_attention_parts
from .fold_expert_gathers import fold_expert_gathers
from .fold_expert_order import fold_expert_order
from .fold_moe_combine import fold_moe_combine
from .fold_routing_order import fold_routing_order
from .fold_row_masks import fold_row_masks
from .fold_swiglu_halves import fold_swiglu_halves
from .fuse_combine_into_norms import fuse_combine_into_norm_parts, fuse_combine_into_norms
from .fuse_group_gemms import fuse_group_gemms
from .fuse_group_linears import fuse_group_linears
from .fuse_quantize_into_producers import fuse_quantize_into_producers
from .fuse_residual_adds import fuse_residual_adds
from .fuse_rotary_into_norm_pairs import fuse_rotary_into_norm_pairs
from .fuse_rotary_tables import fuse_rotary_tables
from .lower_attention import lower_attention
from .lower_embeddings import lower_embeddings
from .lower_gathers import lower_gathers
from .lower_linears import lower_linears
from .lower_moe import lower_moe
from .lower_outer_products import lower_outer_products
from .lower_rms_norm import lower_rms_norm
from .lower_routing import lower_routing
from .lower_row_scales import lower_row_scales
from .lower_silu_muls import lower_silu_muls
from .lower_small_reductions import lower_small_reductions
from .lower_trig import lower_trig
from .narrow_expert_sort_keys import narrow_expert_sort_keys
from .pair_rms_norms import pair_rms_norms
from .report import GemmDecision, LoweringReport
from .select_gemms import select_gemms
from .share_activation_quantize import share_activation_quantize
from .skip_unread_packed_weights import skip_unread_packed_weights
from .stable_sorts import stable_sorts
from .targets import quantized_weight_inputs
from .verify import LoweringError, op_census, verify

PIPELINE = (
    select_gemms,  # decide NVFP4 vs BF16 per GEMM (recipe patterns, layers, shapes)
    lower_linears,  # linear -> nvfp4_linear (weights quantized once, shared) | invariant BF16 linear
    lower_moe,  # grouped experts -> nvfp4_grouped_mm | invariant BF16 grouped mm
    skip_unread_packed_weights,  # weights only read on-grid: no packed bytes written
    lower_routing,  # softmax + top-k of the router -> invariant routing (deterministic ties)
    stable_sorts,  # sort / argsort -> stable: one token order per expert on every implementation
    narrow_expert_sort_keys,  # expert ids sorted as uint8 / int16: 1-2 radix passes, not 8
    lower_rms_norm,  # RMSNorm pattern -> invariant rms_norm
    lower_attention,  # SDPA -> invariant attention (fixed key blocks from position 0)
    lower_small_reductions,  # small float sums (MoE top-k combine) -> fixed-order ordered_sum
    lower_row_scales,  # x[..., H] * w[..., 1] (routing weights) -> row_scale, ordered backward
    lower_gathers,  # x[idx] rows (MoE token gathers) -> gather_rows, position-ordered backward
    fold_expert_gathers,  # gather_rows only read by a grouped GEMM (NVFP4, BF16) -> its x_index
    fold_moe_combine,  # row_scale -> gather_rows -> view -> ordered_sum (top-k combine): one op
    lower_silu_muls,  # silu(a) * b (SwiGLU) -> silu_mul, one implementation for every engine
    fold_row_masks,  # x.masked_fill(rows, 0) read only by moe_combine / silu_mul -> their row_mask
    attach_combine_inverse,  # moe_combine's index = inv of a sort's perm: backward in one pass
    fold_swiglu_halves,  # silu_mul of x's two last-dim halves -> silu_mul_halves(x): one gradient
    lower_outer_products,  # K = 1 matmuls (rotary embedding) -> broadcast multiply, same bits
    lower_trig,  # cos / sin (rotary embedding) -> ATen's kernels as ops: one implementation
    fuse_rotary_tables,  # inference: rotary angles + cos + sin of positions -> one launch
    lower_embeddings,  # token embedding -> embedding op with one opaque (same-kernel) backward
    share_activation_quantize,  # linears reading one X: X (and wgrad's X^T) quantized once
    fuse_quantize_into_producers,  # per-row operands emitted by their producers (norm, SwiGLU)
    fold_expert_order,  # routing ids -> sort, counts, offsets, inverse, weights: one expert_order
    fold_routing_order,  # inference: invariant_routing + expert_order -> one routing_order launch
    fuse_residual_adds,  # x + r read by an RMSNorm -> the norm's residual form: no add kernel
    fuse_combine_into_norms,  # inference, bf16: MoE combine read by add + norm -> one launch
    pair_rms_norms,  # two independent norms of one row length (q / k norms) -> one launch
    fuse_rotary_into_norm_pairs,  # q / k norm pair + rotary (inference, bf16) -> one launch
    verify,  # nothing eligible left, no stock reduction left (strict), op census
)
# By option (the backend's options of the same names):
#   fuse_quantize=False skips QUANTIZE_FUSIONS: every GEMM quantizes its own operand, same bits
#   save_ongrid_weights=False runs drop_ongrid_weights after PIPELINE: no on-grid weight copies,
#     every GEMM dequantizes for itself, same bits
QUANTIZE_FUSIONS = (share_activation_quantize, fuse_quantize_into_producers)


def run_pipeline(
    gm: fx.GraphModule,
    recipe: NVFP4Recipe,
    *,
    save_ongrid_weights: bool = True,
    fuse_quantize: bool = True,
) -> LoweringReport:
    report = LoweringReport(recipe_fingerprint=recipe.fingerprint())
    for graph_pass in PIPELINE:
        if fuse_quantize or graph_pass not in QUANTIZE_FUSIONS:
            graph_pass(gm, recipe, report)
    if not save_ongrid_weights:
        drop_ongrid_weights(gm)
    gm.graph.lint()
    gm.recompile()
    return report


# The entry points code outside passes/ may import (tests/repo/test_import_rules.py): the pipeline,
# its report, and the graph reading and binding of an exported rollout program's weights (and
# the fusion of a bound inference graph's group GEMMs, NVFP4 and BF16, and the deferral of its
# norms' decode codes to the GEMM, then of the MoE combine into such a norm, and the decode
# attention's per-head maxima for the output projection's prologue).
__all__ = [
    "PIPELINE",
    "QUANTIZE_FUSIONS",
    "defer_decode_codes",
    "fuse_combine_into_norm_parts",
    "drop_ongrid_weights",
    "emit_attention_parts",
    "GemmDecision",
    "LoweringError",
    "LoweringReport",
    "op_census",
    "run_pipeline",
    "QuantizeSpec",
    "SiteReads",
    "bind_weight_inputs",
    "fuse_group_gemms",
    "fuse_group_linears",
    "site_reads",
    "quantized_weight_inputs",
    "weight_quantize_sites",
]
