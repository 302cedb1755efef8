"""`fuse_combine_into_norm_parts` (passes/fuse_combine_into_norms.py, the strict recipe's form): in
a bound inference graph, a bf16 `moe_combine` read only (through no-op casts and views) by the
residual add of `rms_norm_quantize_parts` becomes, with that norm, one
`fp4_compile::moe_combine_add_rms_norm_parts`; the graph's outputs (y, the row maxima, h, and
a GEMM reading them) are unchanged, bitwise (CPU references). It refuses (graph unchanged,
reason in the notes) a combine with a row_mask, FP32, a combine with other readers, and a norm
without a residual add. Tier: bitwise + op counts."""

import torch
import torch.fx as fx
from torch._subclasses import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.passes import LoweringReport, fuse_combine_into_norm_parts
from fp4_compile.testing import assert_bitwise_equal

ops = torch.ops.fp4_compile
KEY = NVFP4Recipe.strict().numerics_key
T, K, H = 4, 2, 64
EPS = 1e-6


def _linear(out, codes, scales, gd):
    y, a, a_gd, parts = out[0], out[1], out[2], out[3]
    return ops.nvfp4_linear_parts.default(y, a, a_gd, parts, codes, scales, gd, None, None)


def _plain(r, x, w, idx, nw, codes, scales, gd):
    """The next layer's input norm (h = r + combine) read by a q/k/v-like GEMM; h read again."""
    c = ops.moe_combine.default(x, w, idx, K)
    out = ops.rms_norm_quantize_parts.default(r, c.reshape(T, 1, H), nw, EPS, KEY)
    return _linear(out, codes, scales, gd), out[0], out[3], out[4] * 2


def _first_cast(r, x, w, idx, nw, codes, scales, gd):
    """A no-op `.to(dtype)` and a view, the combine as the first addend."""
    c = ops.moe_combine.default(x, w, idx, K).to(torch.bfloat16).view(T, 1, H)
    out = ops.rms_norm_quantize_parts.default(c, r, nw, EPS, KEY)
    return _linear(out, codes, scales, gd), out[4]


def _row_mask(r, x, w, idx, nw, codes, scales, gd):
    c = ops.moe_combine.default(x, w, idx, K, idx < 1)
    out = ops.rms_norm_quantize_parts.default(r, c.reshape(T, 1, H), nw, EPS, KEY)
    return _linear(out, codes, scales, gd), out[4]


def _read_twice(r, x, w, idx, nw, codes, scales, gd):
    c = ops.moe_combine.default(x, w, idx, K)
    out = ops.rms_norm_quantize_parts.default(r, c.reshape(T, 1, H), nw, EPS, KEY)
    return _linear(out, codes, scales, gd), out[4], c


def _no_residual(r, x, w, idx, nw, codes, scales, gd):
    c = ops.moe_combine.default(x, w, idx, K)
    out = ops.rms_norm_quantize_parts.default(c.reshape(T, 1, H), None, nw, EPS, KEY)
    return (_linear(out, codes, scales, gd),)


def _inputs(dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    r = (torch.randn(T, 1, H, generator=g) * 2).to(dtype)
    x = (torch.randn(T * K, H, generator=g) * 3).to(dtype)
    w = torch.rand(T * K, 1, generator=g).to(dtype)
    idx = torch.randperm(T * K, generator=g)
    nw = (1.0 + 0.3 * torch.randn(H, generator=g)).to(dtype)
    wq = ref.quantize(torch.randn(48, H, generator=g), block="16x16")
    return r, x, w, idx, nw, wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode


def _run(fn, inputs):
    gm = fx.symbolic_trace(fn)
    mode = FakeTensorMode()
    FakeTensorProp(gm, mode).propagate(*(mode.from_tensor(t) for t in inputs))
    want = gm(*inputs)
    report = LoweringReport(recipe_fingerprint="t")
    done = fuse_combine_into_norm_parts(gm.graph, report)
    gm.graph.lint()
    gm.recompile()
    got = gm(*inputs)
    for i, (a, b) in enumerate(zip(got, want)):
        assert_bitwise_equal(a, b, f"output {i}")
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    return done, report, targets


def test_fires_on_the_next_norm_with_the_combine_as_either_addend():
    for fn in (_plain, _first_cast):
        done, report, targets = _run(fn, _inputs())
        assert done == 1 and report.counts["combine_fused_into_norm"] == 1, fn.__name__
        assert targets.count(ops.moe_combine_add_rms_norm_parts.default) == 1
        assert ops.moe_combine.default not in targets
        assert ops.rms_norm_quantize_parts.default not in targets
        assert targets.count(ops.nvfp4_linear_parts.default) == 1


def _refused(fn, why, inputs=None):
    done, report, targets = _run(fn, inputs or _inputs())
    assert done == 0 and ops.moe_combine_add_rms_norm_parts.default not in targets
    assert ops.rms_norm_quantize_parts.default in targets
    assert any(why in note for note in report.notes), report.notes


def test_refuses_a_row_mask():
    _refused(_row_mask, "row_mask")


def test_refuses_a_combine_read_twice():
    _refused(_read_twice, "other ops")


def test_refuses_a_norm_without_a_residual_add():
    _refused(_no_residual, "no residual add")


def test_refuses_fp32():
    _refused(_plain, "not BF16", _inputs(torch.float32))
