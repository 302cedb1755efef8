"""The decode step's launch count (fp4_compile/cost/launches.py), on the CPU, meta tensors.

Contract: exact counts. Each pinned integer is what the count measured for (model, recipe,
batch) at 2 layers and 64 keys: a new launch in the compiled step (an op, a split kernel, an
unfused ATen op) or in the decode program's eager bookkeeping changes it and fails here; a
deliberate change updates the pin and docs/step_cost.md. Also: no KV-cache copy (the write is
`index_put_` in place, tests/rollout/test_kv_cache_write.py), and the eager counter counts.
"""

from unittest import mock

import pytest
import torch

from fp4_compile.cost import build_model
from fp4_compile.cost.launches import LaunchCounter, eager_ops, launch_budget
from fp4_compile.rollout import decode_program

# (model, recipe): (per layer, outside the layers in the compiled step); the same at batch 1, 64
# unless PER_LAYER_AT_BATCH says otherwise.
# Per layer -2: the two residual adds run in the norms after them (passes/fuse_residual_adds.py;
# the last layer's MLP add in the final norm, outside, which stays one launch); -1: the q and k
# norms in one launch (passes/pair_rms_norms.py); -1: the K and V cache writes in one launch
# (fp4_compile::kv_cache_write), whose index is no longer built outside (-1 outside); strict -1:
# the attention output projection's decode GEMM quantizes its operand in its prologue (no
# row_codes launch: nvfp4/gemm_cuda.few_row_parts); strict -3 dense, -1 MoE: the norms' and
# the dense SwiGLU's codes left to the q/k/v (dense: gate/up, down) decode GEMM's prologue
# (passes/defer_decode_codes.py); strict MoE -2 more: the post-attention norm's and the experts'
# SwiGLU's codes left to the experts' gate/up (rows gathered by expert order) and down decode
# GEMMs' prologue (the same pass, nvfp4/grouped_parts.py; the SwiGLU and the down GEMM decide
# on the rows per expert its decode kernel sees, `groups` = E: at batch 64 cdiv(512, 128) = 4,
# not the SwiGLU's 512 rows, which are past the decode buckets); strict -1: o_proj's row maxima
# from the decode attention's epilogue, not a chunk_abs_max launch (invariant_attention_parts +
# nvfp4_linear_with_parts, passes/emit_attention_parts.py); MoE -1: the routing and
# expert_order in one launch (passes/fold_routing_order.py). bf16:
# -2 q/k/v as one linear, -1 gate/up as one (dense; passes/fuse_group_linears.py); MoE -2: no
# unit global scale fills (made once per device), -1: the tokens' gather read by the grouped
# GEMM (passes/fold_expert_gathers.py). -2: the rotary of q and k in the norm pair's launch
# (passes/fuse_rotary_into_norm_pairs.py; the cos / sin tables' bf16 cast in it too). -1 outside:
# the head reads a decode's hidden rows as they are (no gather at Tq = 1, rollout/step.py).
# MoE -1: the top-k combine in the next norm's launch (passes/fuse_combine_into_norms.py): bf16
# in every layer; strict too: the last layer's combine meets the final norm (a bf16
# invariant_add_rms_norm), the others' the next input norm once the weight store binding has
# left its codes to the q/k/v decode GEMM (rms_norm_quantize_parts:
# fuse_combine_into_norm_parts -> moe_combine_add_rms_norm_parts, its row maxima in the launch).
# -4 outside: the mask, its attention kernel arguments and the attentions'
# 2 lengths in one launch (fp4_compile::invariant_position_mask, from
# rollout/kv_cache.attention_mask_4d; were the select_scatter mask, a ones flag,
# attention_mask_args and 2 fulls). -2 outside: the rotary tables' angles, cos and sin in one
# launch (fp4_compile::rotary_tables, passes/fuse_rotary_tables.py; were `fused: clone`, cos, sin).
PINNED = {
    ("qwen3-8b", "strict"): (10, 5),
    ("qwen3-8b", "bf16"): (10, 5),
    ("qwen3-30b-a3b", "strict"): (12, 5),
    ("qwen3-30b-a3b", "bf16"): (12, 5),
}
# (model, recipe, batch): per layer where it differs from PINNED's (none)
PER_LAYER_AT_BATCH: dict[tuple[str, str, int], int] = {}
# layers with fewer launches than the most (none: every layer's MoE combine runs in a norm)
FEWER_IN_LAST_LAYER: dict[tuple[str, str], int] = {}
# one token's sampling and bookkeeping, temperature 1: sample_argmax (the seeded noise made in
# it), the shared log-prob op, decode_advance
EAGER_SAMPLED = 3


@pytest.fixture(scope="module", params=["qwen3-8b", "qwen3-30b-a3b"])
def model(request):
    return request.param, *build_model(request.param, layers=2)


@pytest.mark.parametrize("recipe", ["strict", "bf16"])
@pytest.mark.parametrize("batch", [1, 64])
def test_launch_counts_pinned(model, recipe, batch):
    """Contract: the exact launch counts per layer and outside, no KV-cache copy, and the budget
    verdict (<= 12 per layer, <= 8 outside: both met)."""
    spec, m, note = model
    res = launch_budget(m, note, recipe=recipe, batch=batch, context=64)
    per_layer, outside = PINNED[spec, recipe]
    per_layer = PER_LAYER_AT_BATCH.get((spec, recipe, batch), per_layer)
    got = (res["launches_per_layer"], res["launches_outside_compiled"], res["launches_eager"])
    assert got == (per_layer, outside, EAGER_SAMPLED), (
        res["per_layer_kernels"],
        res["outside_kernels"],
    )
    assert res["launches_outside_layers"] == outside + EAGER_SAMPLED
    fewer = FEWER_IN_LAST_LAYER.get((spec, recipe), 0)
    assert res["launches_by_layer"] == [per_layer, per_layer - fewer]
    assert res["launches_step"] == 2 * per_layer - fewer + outside + EAGER_SAMPLED
    assert res["kv_cache_copy_bytes"] == 0
    # batch 1: single-program launches; dense batch 64: none below 64 (the mask's ones flag, one
    # program, is gone); MoE batch 64: the one-program routing_order
    assert res["min_programs"] == (64 if batch == 64 and spec == "qwen3-8b" else 1)
    assert res["under_one_program_per_sm"]
    assert res["launches_outside_layers"] <= res["budget"]["outside_layers"]
    assert res["budget_met"] is True


def test_counter_counts_ops_not_views():
    """Contract: one launch per ATen op with a kernel, none for a view or an allocation."""
    x = torch.zeros(4, 8, device="meta")
    with LaunchCounter() as counter:
        y = x.view(8, 4).t()
        torch.empty(3, device="meta")
        (y + 1).mul_(2)
    assert counter.ops == ["add", "mul_"]


def test_eager_count_sees_an_added_op():
    """Contract: the eager count is the decode program's real code: an op added to its
    bookkeeping adds a launch; greedy sampling launches as many (the pick, the log-prob op, the
    bookkeeping: the sampled pick makes its noise itself)."""
    base = eager_ops(batch=2, vocab=64, temperature=1.0)
    assert len(base) == EAGER_SAMPLED
    record = decode_program.DecodeProgram.record

    def record_and_clone(self, picked, logp):
        record(self, picked.clone(), logp)

    with mock.patch.object(decode_program.DecodeProgram, "record", record_and_clone):
        assert len(eager_ops(batch=2, vocab=64, temperature=1.0)) == len(base) + 1
    assert len(eager_ops(batch=2, vocab=64, temperature=0.0)) == 3  # pick, log-prob, bookkeeping
