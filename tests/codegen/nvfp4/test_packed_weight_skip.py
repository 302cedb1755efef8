"""Weights quantized on-grid only (`passes/skip_unread_packed_weights.py`,
`fp4_compile::quantize_with_ongrid(..., packed=False)`).

Contracts: the pass switches a weight to on-grid only exactly when every reader of its packed
codes and scales is an NVFP4 GEMM also given its on-grid copy, and `drop_ongrid_weights` packs it
again; packed=False changes neither the on-grid copy nor the global decode (bitwise), its codes
and scales are [.., N, 0]; the GEMM ops take N, K from the copy, refuse empty codes without one
and refuse them on paths that decode packed bytes (CPU); on CUDA forward and gradients are
bitwise those of the packed weight.
"""

from __future__ import annotations

import operator

import pytest
import torch
import torch.fx as fx

import fp4_compile.codegen  # noqa: F401  (registers the ops)
from fp4_compile import NVFP4Recipe
from fp4_compile.codegen.nvfp4 import gemm as impl
from fp4_compile.sr_stream import set_sr_state
from fp4_compile.testing import assert_bitwise_equal

STRICT = NVFP4Recipe.strict()
ops = torch.ops.fp4_compile


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _lowered_graph(rows: int, *, codes_as_output: bool = False):
    """x [rows, 64], w [32, 64] (fake, CUDA) and two NVFP4 linears sharing w's quantize."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fp4_compile.passes.targets import emit_nvfp4_linear, emit_quantize_weight

    graph = fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    with FakeTensorMode():
        x.meta["val"] = torch.empty(rows, 64, device="cuda", dtype=torch.bfloat16)
        w.meta["val"] = torch.empty(32, 64, device="cuda", dtype=torch.bfloat16)
        lin = graph.call_function(torch.ops.aten.linear.default, (x, w))
        lin.meta["val"] = torch.empty(rows, 32, device="cuda", dtype=torch.bfloat16)
    wq = emit_quantize_weight(graph, w, STRICT)
    a = emit_nvfp4_linear(graph, lin, x, w, wq, None, STRICT)
    b = emit_nvfp4_linear(graph, lin, x, w, wq, None, STRICT)
    graph.erase_node(lin)
    graph.output((a, b, wq[0]) if codes_as_output else (a, b))
    return fx.GraphModule(torch.nn.Module(), graph), wq[0].args[0]


def _run_pass(gm):
    from fp4_compile.passes.report import LoweringReport
    from fp4_compile.passes.skip_unread_packed_weights import skip_unread_packed_weights

    report = LoweringReport(recipe_fingerprint="test")
    skip_unread_packed_weights(gm, STRICT, report)
    return report.counts.get("packed_weight_skipped", 0)


def _item(q, i):
    return next(u for u in q.users if u.target is operator.getitem and u.args[1] == i)


def test_pass_skips_the_packed_bytes_that_no_node_reads_and_drop_packs_them_again():
    from fp4_compile.passes import drop_ongrid_weights

    gm, q = _lowered_graph(impl.ONGRID_FORWARD_MIN_ROWS)
    assert q.target is ops.quantize_with_ongrid.default
    assert _run_pass(gm) == 1
    assert q.args[6] is False
    assert tuple(_item(q, 0).meta["val"].shape) == (32, 0)
    (view,) = _item(q, 1).users
    assert tuple(view.meta["val"].shape) == (32, 0) and view.meta["val"].dtype == torch.uint8
    assert _run_pass(gm) == 0, "a skipped weight is not counted twice"
    gm.graph.lint()
    assert drop_ongrid_weights(gm) == 1
    assert q.target is ops.quantize.default and len(q.args) == 6
    assert tuple(_item(q, 0).meta["val"].shape) == (32, 32)
    assert tuple(view.meta["val"].shape) == (32, 4)
    gm.graph.lint()


def test_pass_keeps_packed_bytes_that_something_else_reads():
    gm, q = _lowered_graph(impl.ONGRID_FORWARD_MIN_ROWS, codes_as_output=True)
    assert _run_pass(gm) == 0
    assert len(q.args) == 6 or q.args[6] is True
    gm_small, q_small = _lowered_graph(impl.ONGRID_FORWARD_MIN_ROWS - 1)  # no on-grid copy
    assert _run_pass(gm_small) == 0
    assert q_small.target is ops.quantize.default


@pytest.mark.parametrize("shape,mode", [((48, 96), "per_tensor"), ((3, 32, 64), "per_expert")])
def test_quantize_with_ongrid_unpacked_equals_packed(shape, mode):
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    w = torch.randn(*shape, generator=_gen(1)).bfloat16().to(dev)
    args = (w, "16x16", mode, None, "rne", 0)
    codes, scales, gd, ongrid = ops.quantize_with_ongrid(*args, False)
    _, _, want_gd, want_ongrid = ops.quantize_with_ongrid(*args)
    assert tuple(codes.shape) == (*shape[:-1], 0) and codes.dtype == torch.uint8
    assert tuple(scales.shape) == (*shape[:-1], 0) and scales.dtype == torch.float8_e4m3fn
    assert_bitwise_equal(gd, want_gd, "global decode")
    assert_bitwise_equal(ongrid, want_ongrid, "on-grid copy")
    torch.library.opcheck(ops.quantize_with_ongrid.default, (*args, False))


def _weight(dev, *lead):
    w = torch.randn(*lead, 32, 64, generator=_gen(2)).bfloat16().to(dev)
    mode = "per_expert" if lead else "per_tensor"
    packed = ops.quantize_with_ongrid(w, "16x16", mode, None, "rne", 0)
    unpacked = ops.quantize_with_ongrid(w, "16x16", mode, None, "rne", 0, False)
    return w, packed, unpacked


def test_gemm_ops_refuse_empty_codes_without_a_copy_or_on_a_decoding_path():
    w, _, (codes, scales, gd, ongrid) = _weight("cpu")
    x = torch.randn(4, 64, generator=_gen(3)).bfloat16()
    args = (x, w, codes, scales.view(torch.uint8), gd, None, None, STRICT.numerics_key)
    with pytest.raises(ValueError, match="w_ongrid is None"):
        ops.nvfp4_linear(*args, None, 0)
    with pytest.raises(ValueError, match="no packed bytes"):  # the CPU path decodes the codes
        ops.nvfp4_linear(*args, ongrid, 0)
    with pytest.raises(ValueError, match="w_ongrid must be bfloat16"):
        ops.nvfp4_linear(*args, ongrid[:16], 0)
    with pytest.raises(ValueError, match="no packed bytes"):
        ops.ongrid_weight(codes, scales.view(torch.uint8))


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (the on-grid GEMM path runs only there)"
)
@pytest.mark.parametrize("experts", [0, 3])
def test_cuda_forward_and_gradients_equal_the_packed_weight(experts):
    lead = (experts,) if experts else ()
    w, packed, unpacked = _weight("cuda", *lead)
    rows = impl.ONGRID_FORWARD_MIN_ROWS * max(experts, 1)
    x0 = torch.randn(rows, 64, generator=_gen(4)).bfloat16().cuda()
    go = torch.randn(rows, 32, generator=_gen(5)).bfloat16().cuda()
    results = []
    for codes, scales, gd, ongrid in (packed, unpacked):
        set_sr_state(None)  # both backward calls draw the same stochastic-rounding seeds
        x, wp = x0.clone().requires_grad_(True), w.clone().requires_grad_(True)
        s8 = scales.view(torch.uint8)
        if experts:
            off = torch.arange(1, experts + 1, device="cuda", dtype=torch.int32)
            off = off * impl.ONGRID_FORWARD_MIN_ROWS
            y = ops.nvfp4_grouped_mm(
                x, wp, codes, s8, gd, off, None, STRICT.numerics_key, ongrid, 0
            )
        else:
            y = ops.nvfp4_linear(x, wp, codes, s8, gd, None, None, STRICT.numerics_key, ongrid, 0)
        y.backward(go)
        results.append((y.detach(), x.grad, wp.grad))
    for got, want, name in zip(results[1], results[0], ("y", "dx", "dw")):
        assert_bitwise_equal(got, want, f"{name} experts={experts}")
