"""NVFP4 kernels on the GPU: the Triton quantize, W4A4 GEMM, grouped (MoE) GEMM and MoE wgrad.

Bitwise where that is the contract: quantize == the CPU reference (codes, block scales, global
scales); packed weights == on-grid BF16 weights; grouped == the per-expert loop; every row the
same across the pinned M buckets. Where it is not (one FP32 accumulation order against another),
within the FP32 budget |y - y_ref| <= K * 2**-24 * (|a| @ |b|) * |gd_a gd_b| + 4 * 2**-24 * |y_ref|
against the exact CPU path.
"""

import gpu_internals as gi
import pytest
import torch

from fp4_compile import NVFP4Recipe, nvfp4_mm, quantize, quantize_experts
from fp4_compile.codegen import nvfp4_linear
from fp4_compile.testing import assert_bitwise_equal, assert_nvfp4_equal

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
U = 2.0**-24
BATCH_SIZES = (1, 2, 3, 7, 16, 64, 129, 256)  # crosses every pinned M bucket
M, N, K = 256, 1024, 2048  # the dense GEMM
EXPERT_SHAPES = {"gate_up": (8, 1536, 2048), "down": (8, 2048, 768)}  # (E, N, K), Qwen3-30B-A3B
EXPERT_COUNTS = [3, 0, 17, 64, 1, 130, 0, 41]  # tokens per expert, empty experts included


def _x(*shape, dtype=torch.bfloat16, seed=0):
    """Rows whose magnitudes span 1e-3..1e1 along K (every block scale differs)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.logspace(-3, 1, shape[-1])
    return x.to(dtype).to(DEVICE)


def _wargs(wq, ongrid=None):
    return (wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode, ongrid)


def _offsets():
    return torch.tensor(EXPERT_COUNTS).cumsum(0).to(torch.int32).to(DEVICE)


def _assert_within(err, budget, what):
    over = int((err > budget).sum())
    assert over == 0, (
        f"{what}: {over} of {err.numel()} elements over the FP32 budget, "
        f"max err/budget {float((err / budget).max()):.3e}"
    )


@pytest.mark.parametrize(
    "block, global_scale",
    [
        ("1x16", "per_row"),
        ("1x16", "per_tensor"),
        ("16x16", "per_tensor"),
        ("1x16", 3.0),
        ("16x16", 1e-3),
    ],
)
def test_quantize_equals_reference(block, global_scale):
    """Bitwise: the quantize kernel == the reference quantize run on the CPU and on the GPU
    (codes, block scales, global scales), and its on-grid output == the reference's on-grid
    BF16 values; per-row, per-tensor and static global scales, 1x16 and 16x16 blocks."""
    x = _x(512, 2048)
    gs_cpu = torch.tensor(global_scale) if isinstance(global_scale, float) else global_scale
    gs = gs_cpu.to(DEVICE) if isinstance(gs_cpu, torch.Tensor) else gs_cpu
    got = gi.quantize_triton(x, block=block, global_scale=gs)
    want_cpu = quantize(x.cpu(), block=block, global_scale=gs_cpu)
    assert_nvfp4_equal(got.to("cpu"), want_cpu, "kernel vs CPU reference")
    assert_nvfp4_equal(got, quantize(x, block=block, global_scale=gs), "kernel vs GPU reference")
    ongrid, _ = gi.quantize_triton(x, block=block, global_scale=gs, out="ongrid")
    assert_bitwise_equal(ongrid.cpu(), want_cpu.on_grid(torch.bfloat16), "on-grid output")


@pytest.mark.parametrize(
    "global_scale, seed, shape, dtype",
    [
        ("per_tensor", 7, (256, 1024), torch.float32),
        ("per_row", 2**62 + 3 * 4096 + 1, (384, 2048), torch.bfloat16),  # a 63-bit call seed
    ],
    ids=["per_tensor-seed7-fp32", "per_row-seed63bit-bf16"],
)
def test_quantize_stochastic_equals_reference(global_scale, seed, shape, dtype):
    """Bitwise: stochastic rounding with the noise drawn in the kernel's registers == the CPU
    reference drawing the same seeded stream (codes, block scales, global scales)."""
    x = _x(*shape, dtype=dtype, seed=13)
    kw = dict(global_scale=global_scale, rounding="stochastic", seed=seed)
    got = gi.quantize_triton(x, **kw)
    assert_nvfp4_equal(got.to("cpu"), quantize(x.cpu(), **kw), "stochastic quantize")


def test_quantize_per_expert_equals_reference():
    """Bitwise: the per-expert 16x16 weight quantize == `quantize_experts` on the CPU."""
    w = _x(8, 256, 512)
    got = gi.quantize_triton(w, block="16x16", global_scale="per_expert")
    assert_nvfp4_equal(got.to("cpu"), quantize_experts(w.cpu()), "per-expert quantize")


@pytest.mark.parametrize("op", ["quantize", "quantize_with_ongrid"])
def test_shared_weight_scale_group_equals_reference(op):
    """Bitwise: a q/k/v group's shared amax (`fp4_compile::weight_group_amax`) and each member's
    16x16 quantize with mode "shared" (packed bytes and on-grid copy) on the GPU == the CPU
    reference == the rows of the per-tensor quantize of the members stacked along N."""
    ops = torch.ops.fp4_compile
    ws = [_x(n, 2048, seed=i) * s for i, (n, s) in enumerate([(2048, 1.0), (512, 4.0), (512, 0.5)])]
    amax = ops.weight_group_amax(ws)
    assert_bitwise_equal(amax.cpu(), ops.weight_group_amax([w.cpu() for w in ws]), "group amax")
    whole = quantize(torch.cat(ws).cpu(), block="16x16", global_scale="per_tensor")
    row = 0
    for i, w in enumerate(ws):
        got = getattr(ops, op)(w, "16x16", "shared", amax, "rne", 0)
        rows = slice(row, row + w.shape[0])
        assert_bitwise_equal(got[0].cpu(), whole.codes[rows], f"member {i} codes")
        assert_bitwise_equal(got[1].cpu(), whole.block_scales[rows], f"member {i} block scales")
        assert_bitwise_equal(got[2].cpu(), whole.global_decode, f"member {i} global decode")
        if op == "quantize_with_ongrid":
            ongrid = whole.on_grid(torch.bfloat16)[rows]
            assert_bitwise_equal(got[3].cpu(), ongrid, f"member {i} on-grid")
        row += w.shape[0]


def test_gemm_within_fp32_budget():
    """Error budget (FP32 accumulation order is not the contract): the W4A4 GEMM with FP32
    output vs the exact reference product of the same NVFP4 operands, plus bias."""
    recipe = NVFP4Recipe.strict()
    x, w = _x(M, K, seed=1), _x(N, K, dtype=torch.float32, seed=2)
    bias = _x(N, seed=3)
    wq = quantize(w, block="16x16")
    y32 = gi.nvfp4_gemm.cuda_linear(x.float(), *_wargs(wq), bias, recipe, None)
    xq = quantize(x.float().cpu(), global_scale="per_row")
    wq_cpu = wq.to("cpu")
    y_ref = nvfp4_mm(xq, wq_cpu) + bias.float().cpu()
    a, b = xq.on_grid(torch.float64), wq_cpu.on_grid(torch.float64)
    gd = (xq.global_decode.double() * wq_cpu.global_decode.double()).abs()
    budget = (a.abs() @ b.abs().t()) * gd * (K * U) + 4 * U * y_ref.double().abs()
    _assert_within((y32.cpu().double() - y_ref.double()).abs(), budget, "GEMM vs exact")


def test_gemm_packed_equals_ongrid_weights():
    """Bitwise: the GEMM reading packed E2M1 weights == the GEMM reading on-grid BF16 weights."""
    recipe = NVFP4Recipe.strict()
    x, w = _x(M, K, seed=1), _x(N, K, dtype=torch.float32, seed=2)
    bias = _x(N, seed=3)
    wq = quantize(w, block="16x16")
    packed = gi.nvfp4_gemm.cuda_linear(x, *_wargs(wq), bias, recipe, None)
    ongrid = gi.nvfp4_gemm.cuda_linear(
        x, *_wargs(wq, wq.on_grid(torch.bfloat16)), bias, recipe, None
    )
    assert_bitwise_equal(ongrid, packed, "on-grid vs packed weights")


@pytest.mark.parametrize("weights", ["packed", "on-grid"])
def test_linear_batch_invariance(weights):
    """Bitwise: row i of linear(x[:m]) == row i of linear(x) for every m in BATCH_SIZES (every
    pinned M bucket), and the rows do not depend on their offset in the batch."""
    recipe = NVFP4Recipe.strict()
    wq = quantize(_x(N, K, dtype=torch.float32, seed=2), block="16x16")
    og = wq.on_grid(torch.bfloat16) if weights == "on-grid" else None
    bias = _x(N, seed=3)
    xb = _x(512, K, seed=4)

    def linear(a):
        return gi.nvfp4_gemm.cuda_linear(a, *_wargs(wq, og), bias, recipe, None)

    full = linear(xb[100:])
    for m in BATCH_SIZES:
        assert_bitwise_equal(linear(xb[100 : 100 + m]), full[:m], f"rows of linear(x[:{m}])")
    assert_bitwise_equal(linear(xb)[100:], full, "rows at offset 100")


@pytest.mark.parametrize("weights", ["packed", "on-grid"])
@pytest.mark.parametrize("name", list(EXPERT_SHAPES))
def test_grouped_equals_per_expert_loop(name, weights):
    """Bitwise: one grouped GEMM over all experts' tokens == a dense GEMM per expert."""
    recipe = NVFP4Recipe.strict()
    e, n, k = EXPERT_SHAPES[name]
    wq = quantize_experts(_x(e, n, k, dtype=torch.float32, seed=5))
    og = wq.on_grid(torch.bfloat16) if weights == "on-grid" else None
    offsets = _offsets()
    x = _x(int(offsets[-1]), k, seed=6)
    y = gi.nvfp4_gemm.cuda_linear(x, *_wargs(wq, og), None, recipe, None, offsets=offsets)
    start = 0
    for i, end in enumerate(offsets.tolist()):
        if end > start:
            want = gi.nvfp4_gemm.cuda_linear(
                x[start:end],
                wq.codes[i],
                wq.block_scales[i].view(torch.uint8),
                wq.global_decode[i].reshape(()),
                None if og is None else og[i],
                None,
                recipe,
                None,
            )
            assert_bitwise_equal(y[start:end], want, f"expert {i}")
        start = end


@pytest.mark.parametrize("name", list(EXPERT_SHAPES))
def test_grouped_wgrad_equals_per_expert_loop(name):
    """Bitwise: the one-pass MoE wgrad (stochastic rounding, seeded) == the per-expert loop of
    dense wgrads on the same seeds, an empty expert's gradient is zero; and each expert's
    gradient is within the FP32 budget of the exact CPU path."""
    recipe = NVFP4Recipe.strict()
    _, n, k = EXPERT_SHAPES[name]
    offsets = _offsets()
    t, seed = int(offsets[-1]), 2**40 + 8192
    dy, x = _x(t, n, seed=14), _x(t, k, seed=15)
    dw = gi.grouped_wgrad(dy, x, offsets, recipe, seed)
    start = 0
    for i, end in enumerate(offsets.tolist()):
        if end == start:
            assert int((dw[i] != 0).sum()) == 0, f"empty expert {i}: nonzero gradient"
            continue
        rows = slice(start, end)
        want = gi.nvfp4_gemm.cuda_wgrad(dy[rows], x[rows], recipe, seed + 1 + i)
        assert_bitwise_equal(dw[i], want, f"expert {i}")
        cpu = gi.nvfp4_gemm.cpu_wgrad(dy[rows].cpu(), x[rows].cpu(), recipe, seed + 1 + i)
        m = -(-(end - start) // 16) * 16
        bound = (dy[rows].abs().float().t() @ x[rows].abs().float()).cpu() * (4 * m * U)
        _assert_within((dw[i].cpu() - cpu).abs(), bound, f"expert {i} vs exact CPU path")
        start = end


def test_dgrad_wgrad_within_budget():
    """Error budget: dgrad and wgrad (NVFP4, stochastic rounding, seeded) vs the exact CPU path
    on the same seeds."""
    recipe = NVFP4Recipe.strict()
    m, n, k = 256, 512, 1024
    x, w = _x(m, k, dtype=torch.float32, seed=7), _x(n, k, dtype=torch.float32, seed=8)
    dy = _x(m, n, dtype=torch.float32, seed=9)
    wq = quantize(w, block="16x16")
    dx = gi.nvfp4_gemm.cuda_dgrad(dy, *_wargs(wq), w, recipe, 5).cpu()
    dx_ref = gi.nvfp4_gemm.cpu_dgrad(dy.cpu(), wq.to("cpu"), w.cpu(), recipe, 5)
    _assert_within((dx - dx_ref).abs(), (dy.abs() @ w.abs()).cpu() * (4 * n * U), "dgrad")
    dw = gi.nvfp4_gemm.cuda_wgrad(dy, x, recipe, 6).cpu()
    dw_ref = gi.nvfp4_gemm.cpu_wgrad(dy.cpu(), x.cpu(), recipe, 6)
    _assert_within((dw - dw_ref).abs(), (dy.abs().t() @ x.abs()).cpu() * (4 * m * U), "wgrad")


def test_autograd_linear_gradients_finite():
    """The autograd op `nvfp4_linear` runs forward and backward on the GPU; dX and dW finite."""
    recipe = NVFP4Recipe.strict()
    x = _x(256, 1024, seed=7).requires_grad_()
    w = _x(512, 1024, dtype=torch.float32, seed=8).requires_grad_()
    nvfp4_linear(x, w, recipe=recipe).float().backward(_x(256, 512, dtype=torch.float32, seed=9))
    assert bool(torch.isfinite(x.grad).all()), "dX has non-finite values"
    assert bool(torch.isfinite(w.grad).all()), "dW has non-finite values"
