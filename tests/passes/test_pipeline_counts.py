"""The pass pipeline on real transformers models: op counts after lowering (so a pass that
silently stops matching fails here), BF16 decisions with reasons, the verify pass's refusals."""

import copy

import pytest
import torch

import fp4_compile
from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_llama, tiny_qwen3, tiny_qwen3_moe
from fp4_compile.passes import LoweringError


def _explain(model, recipe=None, batch=2, seq=8):
    ids = torch.randint(0, model.config.vocab_size, (batch, seq))
    (report,) = fp4_compile.explain(model, ids, recipe=recipe, use_cache=False, print_report=False)
    return report


def test_qwen3_counts():
    rep = _explain(tiny_qwen3(layers=2))
    assert rep.counts == {
        "fp4_compile.nvfp4_linear": 14,  # 7 per layer
        "fp4_compile.linear (bf16, invariant)": 1,  # lm_head
        "rms_norm": 9,  # 4 per layer (input, post, q_norm, k_norm) + final
        "attention": 2,
        "repeat_kv_dropped": 4,  # GQA: keys and values per layer, read in place
        "embedding": 1,
        "silu_mul": 2,  # the MLP's SwiGLU per layer
        "cos": 1,  # the rotary embedding, once per forward
        "sin": 1,
        "rotary_tables": 1,  # ... its angles, cos and sin as one op (explain: grad mode off)
        "shared weight scale groups": 4,  # q/k/v and gate/up per layer
        "activation_quantize_shared": 4,  # per layer: q/k/v's X, gate/up's X
        "activation_quantize_saved": 6,  # per layer: 2 of q/k/v, 1 of gate/up
        "rms_norm_quantize_fused": 4,  # per layer: the norms before q/k/v and gate/up
        "silu_mul_quantize_fused": 2,  # per layer: the SwiGLU emits down_proj's operand
        "residual_add_fused": 4,  # the adds read by the norms (not layer 0's input norm) + final
        "rms_norms_paired": 2,  # per layer: q_norm and k_norm in one launch
    }
    lm = [g for g in rep.gemms if g.module == "lm_head"]
    assert lm and lm[0].precision == "bf16" and "lm_head" in lm[0].reason


def test_qwen3_moe_counts():
    rep = _explain(tiny_qwen3_moe(layers=2))
    assert rep.counts["fp4_compile.nvfp4_grouped_mm"] == 4  # gate_up + down per layer
    assert rep.counts["fp4_compile.nvfp4_linear"] == 8  # q k v o per layer
    assert rep.counts["fp4_compile.linear (bf16, invariant)"] == 3  # 2 routers + lm_head
    assert rep.counts["routing_topk"] == 2 and rep.counts["rms_norm"] == 9
    assert rep.counts["embedding"] == 1
    assert rep.counts["cos"] == rep.counts["sin"] == 1  # the rotary embedding
    assert rep.counts["repeat_kv_dropped"] == 4  # GQA: keys and values per layer, read in place
    assert "fp4_compile::repeat_kv" not in rep.census
    assert rep.counts["stable_sort"] == 2  # the experts' sort of (token, expert) pairs, per layer
    assert rep.counts["narrow_expert_sort_keys"] == 2  # ... on uint8 expert ids
    assert rep.counts["silu_mul"] == 2  # the experts' SwiGLU per layer
    assert rep.counts["activation_quantize_shared"] == 2  # q/k/v's X per layer
    assert rep.counts["rms_norm_quantize_fused"] == 4  # per layer: input and post-attn norms
    assert rep.counts["expert_input_from_norm"] == 2  # the experts' gate_up reads the operand
    assert rep.counts["silu_mul_quantize_fused"] == 2  # the SwiGLU emits the down GEMM's operand
    assert rep.counts["expert_input_from_silu_mul"] == 2
    assert rep.counts["residual_add_fused"] == 4  # the adds read by the norms + the final norm's
    assert rep.counts["rms_norms_paired"] == 2  # per layer: q_norm and k_norm in one launch
    assert rep.counts["gather_rows"] == 4  # per layer: tokens to experts, outputs back to slots
    assert rep.counts["expert_gather_folded"] == 2  # ... the first read by gate_up's GEMM itself
    assert rep.counts["moe_combine_folded"] == 2  # row_scale + gather + ordered_sum: one op
    assert rep.counts["expert_order_folded"] == 2  # sort, counts, inverse, weights: one op
    routers = [g for g in rep.gemms if g.module.endswith("mlp.gate")]
    assert len(routers) == 2 and all(g.precision == "bf16" for g in routers)


def test_qwen3_moe_renormalized_routing_is_absorbed():
    """norm_topk_prob (Qwen3-30B-A3B): the renormalization becomes part of the routing op, so no
    stock sum over the k values is left for autograd to differentiate (its backward sum ran in
    different orders under eager and Inductor on the H200)."""
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=4,
        norm_topk_prob=True,
    )
    torch.manual_seed(0)
    rep = _explain(Qwen3MoeForCausalLM(cfg))
    assert rep.counts["routing_topk"] == 2 and rep.counts["routing_renorm"] == 2
    # one fixed-order sum per layer is left: the top-k combine (not the renormalization's)
    assert rep.counts["ordered_sum"] == 2


def test_llama_counts():
    rep = _explain(tiny_llama(layers=1))
    assert rep.counts == {
        "fp4_compile.nvfp4_linear": 7,
        "fp4_compile.linear (bf16, invariant)": 1,
        "rms_norm": 3,
        "attention": 1,
        "repeat_kv_dropped": 2,
        "embedding": 1,
        "silu_mul": 1,
        "cos": 1,
        "sin": 1,
        "rotary_tables": 1,
        "shared weight scale groups": 2,
        "activation_quantize_shared": 2,
        "activation_quantize_saved": 3,
        "rms_norm_quantize_fused": 2,
        "silu_mul_quantize_fused": 1,
        "residual_add_fused": 2,  # the attention's add (post-attention norm), the MLP's (final)
    }


def test_bf16_recipe_and_layer_exclusions():
    rep = _explain(
        tiny_qwen3(layers=3), recipe=NVFP4Recipe.strict(bf16_first_layers=1, bf16_last_layers=1)
    )
    by_layer = {}
    for g in rep.gemms:
        if ".layers." in g.module:
            by_layer.setdefault(int(g.module.split(".layers.")[1].split(".")[0]), set()).add(
                g.precision
            )
    assert by_layer == {0: {"bf16"}, 1: {"nvfp4"}, 2: {"bf16"}}
    rep = _explain(tiny_qwen3(layers=1), recipe=NVFP4Recipe.bf16())
    assert all(g.precision == "bf16" and g.reason == "recipe: quantize=False" for g in rep.gemms)


class _Odd(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(24, 32)

    def forward(self, x):
        return self.proj(x)


def test_unquantizable_shape_is_an_error_in_strict():
    """No silent BF16: strict refuses a GEMM whose K is not a multiple of 16, naming the module,
    its shape and the fix (bf16_modules), and the report table comes with the error."""
    with pytest.raises(LoweringError, match=r"proj \[32, 24\].*bf16_modules"):
        fp4_compile.explain(_Odd(), torch.randn(4, 24), print_report=False)


def test_unquantizable_shape_accepted_by_name_in_strict():
    recipe = NVFP4Recipe.strict(bf16_modules=("*proj",))
    (rep,) = fp4_compile.explain(_Odd(), torch.randn(4, 24), recipe=recipe, print_report=False)
    (g,) = rep.gemms
    assert g.precision == "bf16" and g.reason == "bf16_modules pattern '*proj'"
    assert g.lowered_to.startswith("fp4_compile.linear")


def test_unquantizable_shape_is_one_warning_in_te():
    with pytest.warns(UserWarning, match=r"1 GEMM\(s\) stay BF16 .*proj \[32, 24\]"):
        (rep,) = fp4_compile.explain(
            _Odd(), torch.randn(4, 24), recipe=NVFP4Recipe.te(), print_report=False
        )
    (g,) = rep.gemms
    assert g.precision == "bf16" and "not a multiple of 16" in g.reason
    assert g.lowered_to.startswith("fp4_compile.linear")


def test_verify_refuses_a_stock_gemm():
    class Raw(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(32, 32))

        def forward(self, x):
            return x @ self.w

    with pytest.raises(Exception, match="left on a stock kernel"):
        fp4_compile.explain(Raw(), torch.randn(4, 32), print_report=False)
    assert issubclass(LoweringError, RuntimeError)


def test_explain_table_mentions_every_gemm(capsys):
    model = tiny_qwen3(layers=1)
    fp4_compile.explain(model, torch.randint(0, 128, (1, 4)), use_cache=False)
    out = capsys.readouterr().out
    assert (
        "model.layers.0.self_attn.q_proj" in out
        and "lm_head" in out
        and "bf16_modules pattern" in out
    )


def test_eager_attention_is_refused_with_its_name_and_fix():
    """attn_implementation='eager' leaves stock matmuls in self_attn: the error says that this
    is the eager attention implementation and how to load the model with SDPA instead."""
    model = tiny_qwen3(layers=1).eval()
    model.config._attn_implementation = "eager"
    with pytest.raises(LoweringError, match=r"(?s)self_attn.*attn_implementation='eager'.*'sdpa'"):
        fp4_compile.explain(
            model, torch.randint(0, 100, (1, 8)), use_cache=False, print_report=False
        )


@pytest.mark.parametrize(
    "make, recipe, groups",
    [
        (tiny_qwen3, NVFP4Recipe.strict(), 4),  # q/k/v and gate/up per layer
        (tiny_qwen3_moe, NVFP4Recipe.strict(), 2),  # q/k/v per layer (experts: one tensor)
        (tiny_qwen3, NVFP4Recipe.strict(bf16_modules=("*lm_head*", "*v_proj")), 4),  # q/k left
        (tiny_qwen3, NVFP4Recipe.strict(shared_weight_scale=False), 0),
    ],
    ids=["dense", "moe", "v_bf16", "off"],
)
def test_shared_weight_scale_groups(make, recipe, groups):
    """shared_weight_scale: one weight_group_amax per fused group with two or more NVFP4
    members, each member quantized once with mode "shared"; off: none, every weight per tensor."""
    rep = _explain(make(layers=2), recipe)
    census = rep.census
    assert census.count("fp4_compile::weight_group_amax") == groups, census
    assert rep.counts.get("shared weight scale groups", 0) == groups
    num_linears = rep.counts["fp4_compile.nvfp4_linear"]
    num_grouped = rep.counts.get("fp4_compile.nvfp4_grouped_mm", 0)
    assert census.count("fp4_compile::quantize") == num_linears + num_grouped


def test_a_weight_in_two_shared_scale_groups_is_refused():
    """One parameter used as the q_proj of two layers belongs to two q/k/v groups: one global
    scale per group cannot hold, so the lowering refuses it by name (no silent choice); with
    shared_weight_scale off it lowers."""
    model = tiny_qwen3(layers=2)
    model.model.layers[1].self_attn.q_proj.weight = model.model.layers[0].self_attn.q_proj.weight
    with pytest.raises(ValueError, match="another fused group.*shared_weight_scale=False"):
        _explain(model)
    rep = _explain(model, NVFP4Recipe.strict(shared_weight_scale=False))
    assert "fp4_compile::weight_group_amax" not in rep.census


def _compiled_counts(model, **compile_kwargs):
    """Lowering counts and notes of one compiled forward + backward (the backend's own path)."""
    sink = []
    options = {"recipe": NVFP4Recipe.strict(), "report_sink": sink}
    options.update(compile_kwargs.pop("options", {}))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="minite", options=options, **compile_kwargs)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0)
    )
    logits = compiled(input_ids=ids, use_cache=False).logits
    logits.float().sum().backward()
    merged = copy.deepcopy(sink[0])
    for report in sink[1:]:
        merged.merge(report)
    merged.compiles = sink
    return merged, logits.detach()


def test_fuse_quantize_option_is_the_ab_of_the_fusions():
    """options["fuse_quantize"] = False drops exactly the quantize fusions, with the same bits."""
    from fp4_compile.testing import assert_bitwise_equal

    fused, y_fused = _compiled_counts(tiny_qwen3_moe(layers=1))
    plain, y_plain = _compiled_counts(tiny_qwen3_moe(layers=1), options={"fuse_quantize": False})
    fusion_counts = {
        "activation_quantize_shared",
        "activation_quantize_saved",
        "rms_norm_quantize_fused",
        "silu_mul_quantize_fused",
        "expert_input_from_norm",
        "expert_input_from_silu_mul",
    }
    assert fusion_counts <= set(fused.counts)
    assert not fusion_counts & set(plain.counts)
    assert {k: v for k, v in fused.counts.items() if k not in fusion_counts} == plain.counts
    assert_bitwise_equal(y_fused, y_plain, "logits with vs without the quantize fusions")


def test_symbolic_shapes_get_the_static_folds_and_bits():
    """Under dynamic shapes (sizes as symbols: torch.compile's dynamic=True, or its automatic
    dynamic shapes after a call at a second shape) the MoE folds and fusions that need row
    counts still fire (sizes compared symbolically, read from the graph), with the static
    graph's bits, also at a second shape."""
    from fp4_compile.testing import assert_bitwise_equal

    model = tiny_qwen3_moe(layers=1).eval()
    static, y_static = _compiled_counts(model, dynamic=False)
    dyn, y_dyn = _compiled_counts(model, dynamic=True)
    assert len(static.compiles) == 1 and static.counts["expert_gather_folded"] == 1
    assert all(report.counts == static.counts for report in dyn.compiles)
    assert static.counts["moe_combine_folded"] == 1
    assert_bitwise_equal(y_dyn, y_static, "logits, symbolic vs static sizes")
    ids = torch.randint(
        0, model.config.vocab_size, (3, 24), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        got = torch.compile(
            model, backend="minite", options={"recipe": NVFP4Recipe.strict()}, dynamic=True
        )(input_ids=ids, use_cache=False).logits
        torch._dynamo.reset()
        want = torch.compile(
            model, backend="minite", options={"recipe": NVFP4Recipe.strict()}, dynamic=False
        )(input_ids=ids, use_cache=False).logits
    assert_bitwise_equal(got, want, "logits at a second shape")


def test_traced_dropout_names_dynamic_true():
    """dynamic=True traces the (zero) attention dropout of a training-mode model as a graph
    input: the refusal names the cause, not a dropout the model does not have."""
    with pytest.raises(Exception, match="dynamic=False"):
        _compiled_counts(tiny_qwen3_moe(layers=1).train(), dynamic=True)
