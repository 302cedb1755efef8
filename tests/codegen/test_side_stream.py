"""The GEMM backwards with their wgrad on a side CUDA stream (`codegen/side_stream.py`) == the
same backwards on one stream, bitwise, eager and replayed from a captured CUDA graph; and the
side branch is joined: the main stream may free and reuse the inputs right after the op."""

import pytest
import torch

import fp4_compile.codegen as cg
from fp4_compile import NVFP4Recipe
from fp4_compile.sr_stream import set_sr_state
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA streams")
STRICT = NVFP4Recipe.strict(seed=3)


def _inputs(grouped: bool):
    g = torch.Generator().manual_seed(0)
    if grouped:  # 8 experts, 1024 rows, uneven (and one empty) expert segments
        x = torch.randn(1024, 256, generator=g)
        w = torch.randn(8, 384, 256, generator=g) * 0.05
        counts = torch.tensor([200, 0, 130, 94, 300, 100, 150, 50])
        offsets = counts.cumsum(0).to(torch.int32)
        dy = torch.randn(1024, 384, generator=g)
    else:
        x = torch.randn(1024, 512, generator=g)
        w = torch.randn(768, 512, generator=g) * 0.05
        offsets = None
        dy = torch.randn(1024, 768, generator=g)
    to = dict(device="cuda", dtype=torch.bfloat16)
    return x.to(**to), w.to(**to), None if offsets is None else offsets.cuda(), dy.to(**to)


def _grads(grouped, x, w, offsets, dy):
    x, w = x.clone().requires_grad_(), w.clone().requires_grad_()
    set_sr_state(None)
    if grouped:
        y = cg.nvfp4_grouped_mm(x, w, offsets, recipe=STRICT)
    else:
        y = cg.nvfp4_linear(x, w, recipe=STRICT)
    y.backward(dy)
    return x.grad, w.grad


@pytest.mark.parametrize("grouped", [False, True], ids=["linear", "grouped"])
def test_two_streams_equal_one_stream(grouped, monkeypatch):
    args = _inputs(grouped)
    monkeypatch.setenv("MINITE_SIDE_STREAM", "0")
    want = _grads(grouped, *args)
    monkeypatch.setenv("MINITE_SIDE_STREAM", "1")
    for _ in range(3):  # the side stream's memory is reused across calls
        got = _grads(grouped, *args)
        torch.cuda.synchronize()
        assert_bitwise_equal(got[0], want[0], "dX")
        assert_bitwise_equal(got[1], want[1], "dW")
    set_sr_state(None)


@pytest.mark.parametrize("grouped", [False, True], ids=["linear", "grouped"])
def test_two_streams_in_a_cuda_graph(grouped, monkeypatch):
    """Captured with the side branch, replayed: the same gradients as the eager one-stream op.
    Gradients rounded to nearest here (a captured call draws its stochastic-rounding seed from
    the device counter, not the eager call's: `sr_stream`)."""
    from fp4_compile import QuantSpec
    from fp4_compile.codegen import nvfp4_impl as impl

    x, w, offsets, dy = _inputs(grouped)
    recipe = STRICT.with_(grad=QuantSpec(block="1x16", global_scale="per_tensor", rounding="rne"))
    wq = cg.quantize_weight(w, recipe)
    ops = torch.ops.fp4_compile
    rec = impl.recipe_to_json(recipe)
    codes, scales, gd = wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode

    def backward():
        if grouped:
            return ops.nvfp4_grouped_mm_backward(dy, x, w, codes, scales, gd, offsets, None, rec,
                                                 7, True, True)  # fmt: skip
        return ops.nvfp4_linear_backward(dy, x, w, codes, scales, gd, None, rec, 7, True, True,
                                         False)[:2]  # fmt: skip

    monkeypatch.setenv("MINITE_SIDE_STREAM", "0")
    set_sr_state(None)
    want = [t.clone() for t in backward()]
    monkeypatch.setenv("MINITE_SIDE_STREAM", "1")
    set_sr_state(None)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        backward()  # warm up (kernels compiled, side stream made) outside the capture
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    set_sr_state(None)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backward()
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(out[0], want[0], "dX (graph)")
    assert_bitwise_equal(out[1], want[1], "dW (graph)")
    set_sr_state(None)
