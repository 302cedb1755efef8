"""`GemmCall` (codegen/nvfp4/gemm_call.py), the one place the NVFP4 GEMM ops' arguments are
ordered: its table is the registered schemas', a call survives the trip through positional
arguments and an fx node unchanged, a call runs the op bit for bit as the positional call does
(bitwise tier), and bad combinations raise naming the argument."""

import pytest
import torch

from fp4_compile import codegen  # noqa: F401  (registers the ops)
from fp4_compile.codegen import quantize_weight
from fp4_compile.codegen.nvfp4.gemm_call import (
    OP_ARGS,
    ActivationOperands,
    GemmCall,
    QuantizedWeight,
    decode_recipe,
    gemm_op_name,
    is_gemm,
    op_schema,
)
from fp4_compile.recipe import NVFP4Recipe
from fp4_compile.testing import assert_bitwise_equal

STRICT = NVFP4Recipe.strict()


@pytest.mark.parametrize("name", sorted(OP_ARGS))
def test_table_is_the_registered_schema(name):
    op = getattr(torch.ops.fp4_compile, name)
    assert tuple(a.name for a in op.default._schema.arguments) == OP_ARGS[name]
    assert gemm_op_name(op.default) == name and gemm_op_name(op) == name


# The registered schemas, as stored rollout artifacts (ARTIFACT_VERSION 3) hold them: the table
# that registers the ops (`gemm_call.op_schema`) must keep making exactly these.
PINNED_SCHEMAS = {
    "nvfp4_linear": "(Tensor x, Tensor weight, Tensor w_codes, Tensor w_scales, Tensor "
    "w_global_decode, Tensor? bias, Tensor? x_amax, str recipe, Tensor? w_ongrid=None, SymInt "
    "site=0) -> Tensor",
    "nvfp4_grouped_mm": "(Tensor x, Tensor weight, Tensor w_codes, Tensor w_scales, Tensor "
    "w_global_decode, Tensor offsets, Tensor? x_amax, str recipe, Tensor? w_ongrid=None, SymInt "
    "site=0, Tensor? x_index=None, Tensor? x_perm=None) -> Tensor",
    "nvfp4_linear_quantized": "(Tensor x, Tensor weight, Tensor w_codes, Tensor w_scales, "
    "Tensor w_global_decode, Tensor? bias, Tensor? x_amax, str recipe, Tensor? w_ongrid, SymInt "
    "site, Tensor x_ongrid, Tensor x_gd, Tensor xt_ongrid, Tensor xt_gd) -> Tensor",
    "nvfp4_grouped_mm_quantized": "(Tensor x, Tensor weight, Tensor w_codes, Tensor w_scales, "
    "Tensor w_global_decode, Tensor offsets, Tensor? x_amax, str recipe, Tensor? w_ongrid, "
    "SymInt site, Tensor? x_index, Tensor? x_perm, Tensor x_ongrid, Tensor x_gd) -> Tensor",
}


@pytest.mark.parametrize("name", sorted(OP_ARGS))
def test_registered_schema_is_the_stored_one(name):
    assert op_schema(name) == PINNED_SCHEMAS[name]
    assert str(getattr(torch.ops.fp4_compile, name).default._schema) == (
        f"fp4_compile::{name}{PINNED_SCHEMAS[name]}"
    )


def test_other_targets_are_not_gemms():
    assert gemm_op_name(torch.ops.fp4_compile.quantize.default) is None
    assert gemm_op_name(torch.ops.aten.mm.default) is None
    assert gemm_op_name(torch.ops.fp4_compile.nvfp4_linear_backward.default) is None


def _calls():
    """One call of each op, with distinct stand-ins for every argument."""
    w = QuantizedWeight("codes", "scales", "gd")
    base = dict(
        x="x", weight="weight", w=w, recipe=STRICT, x_amax="amax", w_ongrid="ongrid", site=7
    )
    dense = GemmCall(**base, bias="bias")
    grouped = GemmCall(**base, offsets="offsets", x_index="index", x_perm="perm")
    return {
        "nvfp4_linear": dense,
        "nvfp4_grouped_mm": grouped,
        "nvfp4_linear_quantized": dense._replace(
            x_operands=ActivationOperands("a", "gd_a", "at", "gd_at")
        ),
        "nvfp4_grouped_mm_quantized": grouped._replace(x_operands=ActivationOperands("a", "gd_a")),
    }


@pytest.mark.parametrize("name", sorted(OP_ARGS))
def test_call_round_trips_through_positional_arguments(name):
    call = _calls()[name]
    assert call.op_name() == name
    args = call.args()
    assert len(args) == len(OP_ARGS[name])
    assert dict(zip(OP_ARGS[name], args))["recipe"] == STRICT.numerics_key
    assert GemmCall.from_args(name, args) == call


def test_base_ops_fill_defaults_and_keep_their_emitted_length():
    """nvfp4_linear / nvfp4_grouped_mm nodes carry their arguments through `site`, then x_index
    and x_perm only as far as given (what the lowering has always emitted)."""
    w = QuantizedWeight("codes", "scales", "gd")
    grouped = GemmCall(x="x", weight="weight", w=w, recipe=STRICT, offsets="offsets")
    assert len(grouped.args()) == 10
    assert len(grouped._replace(x_index="index").args()) == 11
    assert len(grouped._replace(x_index="index", x_perm="perm").args()) == 12
    short = GemmCall.from_args(
        "nvfp4_linear", ("x", "weight", "c", "s", "gd", None, None, STRICT.numerics_key)
    )
    assert short.w_ongrid is None and short.site == 0


def test_of_reads_a_graph_node_by_name():
    graph = torch.fx.Graph()
    x, weight, codes, scales, gd = (graph.placeholder(n) for n in ("x", "w", "c", "s", "gd"))
    call = GemmCall(x=x, weight=weight, w=QuantizedWeight(codes, scales, gd), recipe=STRICT, site=3)
    node = graph.call_function(call.overload(), call.args())
    assert is_gemm(node) and is_gemm(node, "nvfp4_linear")
    assert not is_gemm(node, "nvfp4_grouped_mm") and not is_gemm(x)
    assert GemmCall.of(node) == call
    with pytest.raises(ValueError, match="not a call of an NVFP4 GEMM op"):
        GemmCall.of(x)


def test_run_is_the_positional_op_call_bitwise():
    torch.manual_seed(0)
    x, weight, bias = torch.randn(5, 64), torch.randn(32, 64), torch.randn(32)
    wq = quantize_weight(weight, STRICT)
    got = GemmCall(x=x, weight=weight, w=wq, recipe=STRICT, bias=bias).run()
    want = torch.ops.fp4_compile.nvfp4_linear(
        x,
        weight,
        wq.codes,
        wq.block_scales.view(torch.uint8),
        wq.global_decode,
        bias,
        None,
        STRICT.numerics_key,
        None,
        0,
    )
    assert_bitwise_equal(got, want, "GemmCall.run vs the positional call")


def test_bad_calls_name_the_argument():
    w = QuantizedWeight("codes", "scales", "gd")
    with pytest.raises(ValueError, match="bias"):
        GemmCall(x="x", weight="w", w=w, recipe=STRICT, bias="b", offsets="o").args()
    with pytest.raises(ValueError, match="x_index"):
        GemmCall(x="x", weight="w", w=w, recipe=STRICT, x_index="i").args()
    with pytest.raises(ValueError, match="x_perm needs x_index"):
        GemmCall(x="x", weight="w", w=w, recipe=STRICT, offsets="o", x_perm="p").args()
    with pytest.raises(ValueError, match="X\\^T"):
        GemmCall(
            x="x", weight="w", w=w, recipe=STRICT, x_operands=ActivationOperands("a", "gd")
        ).args()
    with pytest.raises(TypeError, match="recipe must be an NVFP4Recipe"):
        GemmCall(x="x", weight="w", w=w, recipe=STRICT.numerics_key).args()
    with pytest.raises(TypeError, match="w must be"):
        GemmCall(x="x", weight="w", w="codes", recipe=STRICT).args()
    with pytest.raises(ValueError, match="'x_ongrid' is missing"):
        GemmCall.from_args("nvfp4_grouped_mm_quantized", _calls()["nvfp4_grouped_mm"].args())


def test_recipe_decodes_in_one_place():
    assert decode_recipe(STRICT.numerics_key) == STRICT
    with pytest.raises(ValueError, match="quantize is False"):
        decode_recipe(NVFP4Recipe.bf16().numerics_key)
