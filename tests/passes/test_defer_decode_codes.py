"""passes/defer_decode_codes.py: a norm emitting its GEMM operand, read only by NVFP4 linears on
its own output, becomes rms_norm_quantize_parts + nvfp4_linear_parts; the graph's outputs stay
bitwise the same (CPU references). Refusals: X^T emitted, the operand read by another op, a
GEMM on another x. Tier: bitwise + op counts."""

import operator

import torch
import torch.fx as fx
from torch._subclasses import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.passes import LoweringReport, defer_decode_codes
from fp4_compile.testing import assert_bitwise_equal

KEY = NVFP4Recipe.strict().numerics_key
ops = torch.ops.fp4_compile


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 64, generator=g) * torch.logspace(-2, 2, 3)[:, None]
    r = torch.randn(3, 64, generator=g)
    w = 1.0 + 0.1 * torch.randn(64, generator=g)
    wq = ref.quantize(torch.randn(48, 64, generator=g), block="16x16")
    return x, r, w, wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode


def _linear(y, out, codes, scales, gd, bias=None):
    return ops.nvfp4_linear_quantized.default(
        y, y, codes, scales, gd, bias, None, KEY, None, 0, out[1], out[2], out[3], out[4]
    )


def _residual(x, r, w, codes, scales, gd):
    """q/k/v- and gate/up-like: a residual norm read by two GEMMs, h read again."""
    out = ops.add_rms_norm_quantize.default(x, r, w, 1e-6, KEY, False)
    a = _linear(out[0], out, codes, scales, gd)
    b = _linear(out[0], out, codes, scales, gd, gd.reshape(1).expand(48).contiguous())
    return a, b, out[5] * 2, out[0] + 1


def _plain(x, r, w, codes, scales, gd):
    out = ops.rms_norm_quantize.default(x, w, 1e-6, KEY, False)
    return (_linear(out[0], out, codes, scales, gd),)


def _transposed(x, r, w, codes, scales, gd):
    out = ops.rms_norm_quantize.default(x, w, 1e-6, KEY, True)
    return (_linear(out[0], out, codes, scales, gd),)


def _other_reader(x, r, w, codes, scales, gd):
    out = ops.rms_norm_quantize.default(x, w, 1e-6, KEY, False)
    return _linear(out[0], out, codes, scales, gd), out[1].float() * 2


def _other_x(x, r, w, codes, scales, gd):
    out = ops.rms_norm_quantize.default(x, w, 1e-6, KEY, False)
    return (_linear(out[0] + 0, out, codes, scales, gd),)


def _graph(fn, inputs):
    gm = fx.symbolic_trace(fn)
    mode = FakeTensorMode()
    FakeTensorProp(gm, mode).propagate(*(mode.from_tensor(t) for t in inputs))
    return gm


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def _run(fn):
    inputs = _inputs()
    gm = _graph(fn, inputs)
    want = gm(*inputs)
    report = LoweringReport(recipe_fingerprint="t")
    done = defer_decode_codes(gm.graph, report)
    gm.graph.lint()
    gm.recompile()
    got = gm(*inputs)
    for i, (a, b) in enumerate(zip(got, want)):
        assert_bitwise_equal(a, b, f"output {i}")
    return gm, done, report


def test_fires_on_residual_norm_read_by_two_linears():
    gm, done, report = _run(_residual)
    targets = _targets(gm)
    assert done == 1 and report.counts["decode_codes_deferred"] == 1
    assert targets.count(ops.rms_norm_quantize_parts.default) == 1
    assert targets.count(ops.nvfp4_linear_parts.default) == 2
    assert ops.add_rms_norm_quantize.default not in targets
    assert ops.nvfp4_linear_quantized.default not in targets
    parts = next(n for n in gm.graph.nodes if n.target is ops.rms_norm_quantize_parts.default)
    assert parts.args[1] is not None  # the residual carried over


def test_fires_on_plain_norm():
    gm, done, _ = _run(_plain)
    assert done == 1 and ops.nvfp4_linear_parts.default in _targets(gm)
    parts = next(n for n in gm.graph.nodes if n.target is ops.rms_norm_quantize_parts.default)
    assert parts.args[1] is None
    assert all(n.target is not operator.getitem or n.users for n in gm.graph.nodes)


def _refused(fn, why):
    gm, done, report = _run(fn)
    assert done == 0 and ops.nvfp4_linear_parts.default not in _targets(gm)
    assert any(why in note for note in report.notes), report.notes


def test_refuses_transposed_operand():
    _refused(_transposed, "X^T")


def test_refuses_operand_read_by_another_op():
    _refused(_other_reader, "another op")


def test_refuses_gemm_on_another_x():
    _refused(_other_x, "another x")


def _swiglu(x, r, w, codes, scales, gd):
    """A dense MLP's SwiGLU read by its down projection (K = C = 64 here)."""
    out = ops.silu_mul_quantize.default(x, r, None, KEY, False)
    return (_linear(out[0], out, codes, scales, gd),)


def test_fires_on_dense_swiglu():
    gm, done, _ = _run(_swiglu)
    targets = _targets(gm)
    assert done == 1 and ops.silu_mul_quantize_parts.default in targets
    assert ops.silu_mul_quantize.default not in targets
    assert targets.count(ops.nvfp4_linear_parts.default) == 1


# The MoE block: the experts' GEMMs (nvfp4_grouped_mm_quantized) read the post-attention norm's
# operand gathered by expert order (x_index), and the experts' SwiGLU's (silu_mul_halves_quantize
# on the gate/up output, rows already in expert order); the router reads the normed values.


def _moe_inputs():
    x, r, w, *_ = _inputs()
    g = torch.Generator().manual_seed(1)
    up = ref.quantize_experts(torch.randn(2, 64, 64, generator=g))
    down = ref.quantize_experts(torch.randn(2, 48, 32, generator=g))
    offsets = torch.tensor([3, 6], dtype=torch.int32)
    index = torch.tensor([0, 2, 1, 2, 0, 1], dtype=torch.int32)  # 3 tokens, top-2 of 2 experts
    weights = [(q.codes, q.block_scales.view(torch.uint8), q.global_decode) for q in (up, down)]
    return x, r, w, *weights[0], *weights[1], offsets, index


def _experts(x, out, weight, offsets, index):
    return ops.nvfp4_grouped_mm_quantized.default(
        x, x, *weight, offsets, None, KEY, None, 0, index, None, out[1], out[2]
    )


def _moe(x, r, w, c1, s1, g1, c2, s2, g2, offsets, index):
    """The MoE block: norm -> router + gate/up (gathered) -> SwiGLU -> down; h read after."""
    out = ops.add_rms_norm_quantize.default(x, r, w, 1e-6, KEY, False)
    flat = out[0].view(-1, 64)
    router = flat.reshape(-1, 64).sum(dim=1)
    gate_up = _experts(flat, out, (c1, s1, g1), offsets, index)
    act = ops.silu_mul_halves_quantize.default(gate_up, None, KEY)
    down = _experts(act[0].to(torch.float32), act, (c2, s2, g2), offsets, None)
    return down, router, out[5] * 2


def _moe_other_x(x, r, w, c1, s1, g1, c2, s2, g2, offsets, index):
    out = ops.add_rms_norm_quantize.default(x, r, w, 1e-6, KEY, False)
    return (_experts(out[0] * 1, out, (c1, s1, g1), offsets, index),)


def _run_moe(fn):
    inputs = _moe_inputs()
    gm = _graph(fn, inputs)
    want = gm(*inputs)
    report = LoweringReport(recipe_fingerprint="t")
    done = defer_decode_codes(gm.graph, report)
    gm.graph.lint()
    gm.recompile()
    for i, (a, b) in enumerate(zip(gm(*inputs), want)):
        assert_bitwise_equal(a, b, f"output {i}")
    return gm, done, report


def test_fires_on_moe_norm_and_swiglu():
    """The norm (its values still read by the router) and the experts' SwiGLU (on slices of
    the gate/up output) both rewritten; the experts' GEMMs read the parts; no view of y left
    unread."""
    gm, done, report = _run_moe(_moe)
    targets = _targets(gm)
    assert done == 2 and report.counts["decode_codes_deferred"] == 2, report.notes
    assert targets.count(ops.nvfp4_grouped_mm_parts.default) == 2
    assert ops.rms_norm_quantize_parts.default in targets
    assert ops.silu_mul_quantize_parts.default in targets
    for old in (ops.add_rms_norm_quantize, ops.silu_mul_halves_quantize):
        assert old.default not in targets
    assert ops.nvfp4_grouped_mm_quantized.default not in targets
    assert all(n.users for n in gm.graph.nodes if n.op == "call_method"), "a dead view"
    # both sides of the SwiGLU -> down pair decide on the rows per expert (groups = E = 2); the
    # norm -> gathered gate/up pair on the norm's rows (groups 1)
    nodes = {n.target: n for n in gm.graph.nodes if n.op == "call_function"}
    assert nodes[ops.silu_mul_quantize_parts.default].args[4] == 2
    grouped = [n for n in gm.graph.nodes if n.target is ops.nvfp4_grouped_mm_parts.default]
    assert [(n.args[9] is None, n.args[10]) for n in grouped] == [(False, 1), (True, 2)]


def test_refuses_experts_on_another_x():
    gm, done, report = _run_moe(_moe_other_x)
    assert done == 0 and ops.nvfp4_grouped_mm_parts.default not in _targets(gm)
    assert any("another x" in note for note in report.notes), report.notes
