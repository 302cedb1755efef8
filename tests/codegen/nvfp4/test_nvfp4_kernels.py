"""The Triton NVFP4 kernels themselves, under TRITON_INTERPRET=1 on CPU (conftest sets it).

Tiers: bitwise (quantize kernel vs reference in every mode; GEMM batch invariance; packed vs
on-grid weights; grouped == per-expert loop); error budget (GEMM vs the exact reference:
|y - y_ref| <= (K * 2**-24) * (|a| @ |b|) * |gd_a gd_b| + 4 * 2**-24 * |y_ref|, Higham's gamma_K
for FP32 accumulation of exact products plus the epilogue roundings).
"""

import os

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.codegen.nvfp4 import gemm as impl
from fp4_compile.sr_stream import nth_call_seed, set_sr_state
from fp4_compile.testing import assert_bitwise_equal, assert_nvfp4_equal

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
STRICT = NVFP4Recipe.strict()
U = 2.0**-24


def _x(*shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.logspace(-4, 2, shape[-1])
    return x.to(dtype).to(DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "block,mode",
    [
        ("1x16", "per_row"),
        ("1x16", "per_tensor"),
        ("16x16", "per_tensor"),
        ("1x16", "static"),
        ("16x16", "static_tiny"),
    ],
)
def test_quantize_kernel_bitwise(dtype, block, mode):
    """Bitwise: kernel codes, E4M3 scales (subnormal ones too) and global scales == reference;
    the on-grid output == reference on_grid in bf16."""
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    x = _x(48, 96, dtype=dtype)
    gs = {"static": torch.tensor(3.0), "static_tiny": torch.tensor(1e-3)}.get(mode, mode)
    if isinstance(gs, torch.Tensor):
        gs = gs.to(DEV)
    want = ref.quantize(x, block=block, global_scale=gs)
    assert_nvfp4_equal(quantize_triton(x, block=block, global_scale=gs), want)
    og, gd = quantize_triton(x, block=block, global_scale=gs, out="ongrid")
    assert_bitwise_equal(og, want.on_grid(torch.bfloat16), "on-grid")
    assert_bitwise_equal(gd, want.global_decode, "global decode")


def _e2m1_edge_values() -> torch.Tensor:
    """FP32 [R, 16] blocks whose encode scale is exactly 1 (block max 6, static amax 6 * 448:
    global decode 1, E4M3 scale 1), so v = x: every E2M1 grid point and rounding threshold,
    one ulp either side of each, both signs, -0.0 and subnormals, 15 per block after the 6."""
    pts = torch.tensor(
        [
            0.0,
            0.25,
            0.5,
            0.75,
            1.0,
            1.25,
            1.5,
            1.75,
            2.0,
            2.5,
            3.0,
            3.5,
            4.0,
            5.0,
            6.0,
            1e-40,
            0.1,
            0.6,
            2.2,
            4.4,
            5.5,
            5.9,
        ]
    )
    near = torch.cat([pts, torch.nextafter(pts, pts + 1), torch.nextafter(pts, pts - 1).abs()])
    vals = torch.cat([near, -near, torch.tensor([-0.0])]).clamp(max=6.0)
    vals = torch.cat([vals, vals.new_zeros((-vals.numel()) % 15)]).reshape(-1, 15)
    return torch.cat([vals.new_full((vals.shape[0], 1), 6.0), vals], dim=1)


def test_quantize_kernel_e2m1_ties_and_thresholds():
    """Bitwise: at every E2M1 threshold (ties to even) and grid point, one ulp either side,
    the kernel's codes and on-grid values == reference, for RNE and stochastic rounding (on
    the grid: never rounded away; between points: the reference's probability)."""
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    x = _e2m1_edge_values().to(DEV)
    amax = torch.tensor(6.0 * 448.0, device=DEV)
    want = ref.quantize(x, global_scale=amax)
    assert bool((want.block_scales.float() == 1.0).all()) and float(want.global_decode) == 1.0
    assert_nvfp4_equal(quantize_triton(x, global_scale=amax), want)
    og, _ = quantize_triton(x, global_scale=amax, out="ongrid")
    assert_bitwise_equal(og, want.on_grid(torch.bfloat16), "on-grid")
    for seed in (3, 2**61 + 77):
        want = ref.quantize(x, global_scale=amax, rounding="stochastic", seed=seed)
        got = quantize_triton(x, global_scale=amax, rounding="stochastic", seed=seed)
        assert_nvfp4_equal(got, want)
        og, _ = quantize_triton(
            x, global_scale=amax, rounding="stochastic", seed=seed, out="ongrid"
        )
        assert_bitwise_equal(og, want.on_grid(torch.bfloat16), "on-grid SR")


def test_quantize_kernel_stochastic_and_experts():
    """Bitwise: stochastic rounding with the reference's seeded stream; per-expert weights."""
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    x = _x(32, 64, dtype=torch.float32)
    for seed in (9, 2**62 + 4097):  # a small seed and a call seed's size (sr_stream.call_seed)
        want = ref.quantize(x, global_scale="per_tensor", rounding="stochastic", seed=seed)
        got = quantize_triton(x, global_scale="per_tensor", rounding="stochastic", seed=seed)
        assert_nvfp4_equal(got, want)
    w = _x(3, 32, 48)
    assert_nvfp4_equal(
        quantize_triton(w, block="16x16", global_scale="per_expert"), ref.quantize_experts(w)
    )
    # the per-expert amax (row maxima, then per expert): a NaN poisons its own expert only, an
    # inf gives that expert the unit encode, the others are unchanged
    from fp4_compile.codegen.nvfp4.quantize_kernel import global_stage

    w[1, 5, 7], w[2, 31, 0] = float("nan"), float("inf")
    gd, mult = global_stage(w, "per_expert")
    want_amax = w.abs().amax(dim=(-2, -1), keepdim=True).float()
    want_enc = ref.global_encode_from_amax(want_amax)
    want_gd = torch.ones_like(want_enc) / want_enc
    assert gd.shape == (3, 1, 1) and bool(gd[1].isnan().all()) and float(gd[2]) == 1.0
    assert_bitwise_equal(gd[[0, 2]], want_gd[[0, 2]], "per-expert global decode")
    assert_bitwise_equal(mult[[0, 2]], (want_enc * (1 / 6.0))[[0, 2]].float(), "multiplier")


def _budget(xq, wq, y_ref):
    a, b = xq.on_grid(torch.float64), wq.on_grid(torch.float64)
    k = a.shape[-1]
    gd = (xq.global_decode.double().reshape(-1, 1) * wq.global_decode.double().reshape(1, -1)).abs()
    return (a.abs() @ b.abs().t()) * gd * (k * U) + 4 * U * y_ref.double().abs()


def test_gemm_error_budget_and_paths():
    """Budget vs the exact reference; bitwise: packed weights == on-grid bf16 weights."""
    m, n, k = 40, 48, 160
    x, w, bias = _x(m, k), _x(n, k, dtype=torch.float32, seed=1), _x(n, dtype=torch.float32, seed=2)
    wq = ref.quantize(w, block="16x16")
    codes, scales, gd = wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode
    y = impl.cuda_linear(x.float(), codes, scales, gd, None, bias, STRICT, None)
    xq = ref.quantize(x.float(), global_scale="per_row")
    y_ref = ref.nvfp4_mm(xq, wq) + bias
    assert bool(((y.double() - y_ref.double()).abs() <= _budget(xq, wq, y_ref)).all())
    y_og = impl.cuda_linear(
        x.float(), codes, scales, gd, wq.on_grid(torch.bfloat16), bias, STRICT, None
    )
    assert_bitwise_equal(y_og, y, "on-grid vs packed weights")
    yb = impl.cuda_linear(x, codes, scales, gd, None, bias, STRICT, None)
    assert yb.dtype == torch.bfloat16


@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="patches the interpreter's tile table; on CUDA the sm_90 tiles run in tests/gpu",
)
@pytest.mark.parametrize("block_k", [64, 128])
def test_packed_gemm_scale_words_equal_scale_bytes(block_k, monkeypatch):
    """The packed kernel reads the scale bytes as 32-bit words of 4 where whole words tile a K
    step (block_k 64; 128 with a K tail of one word): bitwise the byte loads' product at the same
    tile, and within the error budget of the exact reference."""
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.nvfp4 import gemm_kernel

    m, n, k = 40, 48, 192
    x, w = _x(m, k, seed=31), _x(n, k, dtype=torch.float32, seed=32)
    wq = ref.quantize(w, block="16x16")
    args = (wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode, None, None, STRICT, None)
    tile = ((None, configs.TileConfig(16, 32, block_k, num_warps=1, num_stages=1)),)
    monkeypatch.setitem(configs.PINNED, ("interpreter", "fp32", "nvfp4_gemm"), tile)
    assert gemm_kernel.words_tile_k(args[1], k, block_k)
    by_words = impl.cuda_linear(x.float(), *args)
    monkeypatch.setattr(gemm_kernel, "words_tile_k", lambda *a: False)
    by_bytes = impl.cuda_linear(x.float(), *args)
    assert_bitwise_equal(by_words, by_bytes, f"scale words vs scale bytes, block_k {block_k}")
    xq = ref.quantize(x.float(), global_scale="per_row")
    y_ref = ref.nvfp4_mm(xq, wq)
    assert bool(((by_words.double() - y_ref.double()).abs() <= _budget(xq, wq, y_ref)).all())


def test_gemm_batch_invariance():
    """Bitwise: row i of the kernel's op(x[:m]) == row i of op(x), m in {1, 3, 17}, and rows
    taken from another position."""
    n, k = 32, 64
    x, w = _x(37, k), _x(n, k, dtype=torch.float32, seed=1)
    wq = ref.quantize(w, block="16x16")
    args = (wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode, None, None, STRICT, None)
    full = impl.cuda_linear(x[4:], *args)
    assert_bitwise_equal(impl.cuda_linear(x, *args)[4:], full, "shifted rows")
    for m in (1, 3, 17):
        assert_bitwise_equal(impl.cuda_linear(x[4 : 4 + m], *args), full[:m], f"m={m}")


@pytest.mark.parametrize("k", [32, 256])
def test_gemm_rows_invariant_across_every_bucket(k):
    """Bitwise, on cancellation-heavy rows (magnitudes 1e-4..1e2): row i of op(x[:m]) == row i of
    op(x) for m on both sides of every pinned M bucket (on CUDA: 64 | 65, the 128-row configs
    beyond). This caught mma.sync (BLOCK_M 16) vs wgmma rounding on the H200."""
    n = 64
    x, w = _x(300, k, seed=21), _x(n, k, dtype=torch.float32, seed=22)
    wq = ref.quantize(w, block="16x16")
    args = (wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode, None, None, STRICT, None)
    full = impl.cuda_linear(x, *args)
    for m in (1, 16, 17, 63, 64, 65, 129, 257):
        assert_bitwise_equal(impl.cuda_linear(x[:m], *args), full[:m], f"m={m}")


@pytest.mark.parametrize("shape", [(4, 32, 64), (4, 64, 32)], ids=["gate_up", "down"])
def test_grouped_kernel_equals_loop(shape):
    """Bitwise: one grouped launch == per-expert dense launches (empty groups included)."""
    e, n, k = shape
    w = _x(e, n, k, dtype=torch.float32, seed=3)
    wq = ref.quantize_experts(w)
    x = _x(29, k)
    offsets = torch.tensor([5, 5, 22, 29], dtype=torch.int32, device=DEV)
    sc = wq.block_scales.view(torch.uint8)
    y = impl.cuda_linear(
        x, wq.codes, sc, wq.global_decode, None, None, STRICT, None, offsets=offsets
    )
    start = 0
    for i, end in enumerate(offsets.tolist()):
        if end > start:
            want = impl.cuda_linear(
                x[start:end],
                wq.codes[i],
                sc[i],
                wq.global_decode[i].reshape(()),
                None,
                None,
                STRICT,
                None,
            )
            assert_bitwise_equal(y[start:end], want, f"expert {i}")
        start = end
    y_cpu = torch.ops.fp4_compile.nvfp4_grouped_mm(
        x.cpu(),
        w.cpu(),
        wq.codes.cpu(),
        sc.cpu(),
        wq.global_decode.cpu(),
        offsets.cpu(),
        None,
        STRICT.numerics_key,
        None,
    )
    assert (y.float().cpu() - y_cpu.float()).abs().max() <= 2.0**-7 * y_cpu.float().abs().max()


def test_backward_kernels_match_cpu_path():
    """dgrad / wgrad kernels vs the CPU (exact) path on the same quantized operands (same SR
    seeds): within the FP32 accumulation budget (relative 2**-16 of |A| @ |B| here)."""
    m, n, k = 20, 32, 48
    x, w = _x(m, k, dtype=torch.float32), _x(n, k, dtype=torch.float32, seed=1)
    dy = _x(m, n, dtype=torch.float32, seed=4)
    wq = ref.quantize(w, block="16x16")
    sc = wq.block_scales.view(torch.uint8)
    dx = impl.cuda_dgrad(dy, wq.codes, sc, wq.global_decode, None, w, STRICT, 5)
    dx_ref = impl.cpu_dgrad(dy, wq, w, STRICT, 5)
    scale = dy.abs() @ w.abs()
    assert bool(((dx - dx_ref).abs() <= scale * 2.0**-16).all()), "dgrad"
    dw = impl.cuda_wgrad(dy, x, STRICT, 6)
    dw_ref = impl.cpu_wgrad(dy, x, STRICT, 6)
    assert bool(((dw - dw_ref).abs() <= (dy.abs().t() @ x.abs()) * 2.0**-16).all()), "wgrad"


@pytest.mark.parametrize(
    "grad",
    [("per_tensor", "stochastic"), ("per_row", "rne"), ("per_row", "stochastic")],
    ids=["per_tensor-sr", "per_row-rne", "per_row-sr"],
)
def test_grouped_wgrad_equals_per_expert_loop(grad):
    """Bitwise: the one-pass MoE wgrad == the per-expert loop of dense wgrads (seed + 1 + e),
    with empty experts, segments of odd lengths and segments over several K chunks; and the
    backward op's dW on the kernels == that loop."""
    from fp4_compile.codegen.nvfp4.grouped_wgrad_kernel import grouped_wgrad
    from fp4_compile.recipe import QuantSpec

    rec = NVFP4Recipe.strict(grad=QuantSpec(block="1x16", global_scale=grad[0], rounding=grad[1]))
    e, n, k = 5, 32, 48
    offsets = torch.tensor([5, 5, 22, 29, 70], dtype=torch.int32, device=DEV)
    dy = _x(70, n, seed=11)
    x = _x(70, k, seed=12)
    seed = 2**40 + 4096
    dw = grouped_wgrad(dy, x, offsets, rec, seed)
    start = 0
    for i, end in enumerate(offsets.tolist()):
        want = torch.zeros(n, k, device=DEV)
        if end > start:
            want = impl.cuda_wgrad(dy[start:end], x[start:end], rec, seed + 1 + i)
        assert_bitwise_equal(dw[i], want, f"expert {i}")
        start = end
    # the backward op: on CUDA it runs grouped_wgrad (bitwise), on CPU the reference loop
    set_sr_state(None)
    w = _x(e, n, k, dtype=torch.float32, seed=3)
    wq = ref.quantize_experts(w)
    _, dw_op = torch.ops.fp4_compile.nvfp4_grouped_mm_backward(
        dy,
        x,
        w,
        wq.codes,
        wq.block_scales.view(torch.uint8),
        wq.global_decode,
        offsets,
        None,
        rec.numerics_key,
        7,
        False,
        True,
    )
    dw = grouped_wgrad(dy, x, offsets, rec, nth_call_seed(7, 0))
    if DEV == "cuda":
        assert_bitwise_equal(dw_op, dw, "op dW")
    else:
        scale = torch.stack(
            [dy[s:t].abs().t() @ x[s:t].abs() for s, t in zip([0, 5, 5, 22, 29], offsets.tolist())]
        )
        assert bool(((dw_op - dw).abs() <= scale.float() * 2.0**-16).all()), "op dW vs kernel"
        assert int((dw_op != dw).sum()) < dw.numel() // 2, "the comparison must see the same SR"


@pytest.mark.parametrize(
    "grad",
    [("per_tensor", "stochastic"), ("per_row", "rne"), ("per_row", "stochastic")],
    ids=["per_tensor-sr", "per_row-rne", "per_row-sr"],
)
@pytest.mark.parametrize("tokens", [40, 48])
@pytest.mark.parametrize("flat32", [True, False], ids=["int32-index", "int64-index"])
def test_dense_wgrad_quantizes_the_transposes_in_place(grad, tokens, flat32, monkeypatch):
    """Bitwise: the dense wgrad, which quantizes dY^T and X^T straight from dY and X
    (`quantize_transposed_ongrid`: no transposed copies), == quantizing the padded transposed
    copies (`quantize_triton(pad_tokens(t.t().contiguous()))`) and the same GEMM; the operands
    themselves equal too; int and device-held seeds; given dY's amax or not; the segmented
    kernel's stochastic-rounding index in int32 (FLAT32, small tensors) and in int64."""
    from fp4_compile.codegen.nvfp4 import codes_kernel

    if not flat32:
        monkeypatch.setattr(codes_kernel, "FLAT32_LIMIT", 0)
    from fp4_compile.codegen.nvfp4.gemm_kernel import launch_gemm
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton
    from fp4_compile.recipe import QuantSpec

    rec = NVFP4Recipe.strict(grad=QuantSpec(block="1x16", global_scale=grad[0], rounding=grad[1]))
    dy, x = _x(tokens, 80, seed=61), _x(tokens, 48, seed=62)  # 80 rows: > one 64-row tile
    seed = 2**40 + 3 * 4096 + 1
    a_old, gd_a_old = quantize_triton(
        impl.pad_tokens(dy.t().contiguous()),
        block="1x16",
        global_scale=grad[0],
        rounding=grad[1],
        seed=seed,
        out="ongrid",
    )
    a_new, gd_a_new = impl.quantize_transposed_ongrid(
        dy, global_scale=grad[0], rounding=grad[1], seed=seed
    )
    assert_bitwise_equal(a_new, a_old, "dY^T on-grid")
    assert_bitwise_equal(gd_a_new, gd_a_old, "dY^T global decode")
    b_old, gd_b_old = quantize_triton(
        impl.pad_tokens(x.t().contiguous()), block="1x16", global_scale="per_tensor", out="ongrid"
    )
    want = launch_gemm(
        a_old, gd_a_old, b_old, gd_b_old, out_dtype=torch.float32, config_op="nvfp4_wgrad"
    )
    assert_bitwise_equal(impl.cuda_wgrad(dy, x, rec, seed), want, "dW")
    t = torch.tensor([seed], dtype=torch.int64, device=DEV)
    assert_bitwise_equal(impl.cuda_wgrad(dy, x, rec, t), want, "dW, device-held seed")
    if grad[0] == "per_tensor":
        amax = impl.grad_amax(dy, rec)
        assert_bitwise_equal(impl.cuda_wgrad(dy, x, rec, seed, dy_amax=amax), want, "dW, amax")


def test_ongrid_weight_kernel_equals_on_grid():
    """Bitwise: the one-launch dequantize == NVFP4Tensor.on_grid(bf16), dense and experts, with
    subnormal E4M3 scales."""
    from fp4_compile.codegen.nvfp4.ongrid_weight_kernel import ongrid_weight

    for shape in ((48, 96), (3, 32, 64)):
        w = _x(*shape, dtype=torch.float32, seed=31)
        wq = ref.quantize_experts(w) if len(shape) == 3 else ref.quantize(w, block="16x16")
        got = ongrid_weight(wq.codes, wq.block_scales.view(torch.uint8))
        assert_bitwise_equal(got, wq.on_grid(torch.bfloat16), f"on-grid {shape}")


def test_quantize_kernel_packed_and_ongrid_in_one_pass():
    """Bitwise: quantize_triton(out="both") (a weight's packed form and its on-grid copy from
    one kernel pass) == out="packed" and the decode of those bytes, dense and experts."""
    from fp4_compile.codegen.nvfp4.ongrid_weight_kernel import ongrid_weight
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    for shape, mode in (((48, 96), "per_tensor"), ((3, 32, 64), "per_expert")):
        w = _x(*shape, dtype=torch.bfloat16, seed=32).to(DEV)
        q, grid = quantize_triton(w, block="16x16", global_scale=mode, out="both")
        want = quantize_triton(w, block="16x16", global_scale=mode)
        assert_bitwise_equal(q.codes, want.codes, f"codes {shape}")
        assert_bitwise_equal(q.block_scales, want.block_scales, f"scales {shape}")
        assert_bitwise_equal(q.global_decode, want.global_decode, f"gd {shape}")
        want_grid = ongrid_weight(want.codes, want.block_scales.view(torch.uint8))
        assert grid.dtype == torch.bfloat16 and grid.shape == w.shape
        assert_bitwise_equal(grid, want_grid, f"on-grid {shape}")


def test_invariant_grouped_kernel_equals_per_expert_linear():
    """Bitwise: the one-launch BF16 grouped GEMM (the bf16 recipe's MoE experts on CUDA) == a
    loop of the invariant linear kernel per expert, empty experts included; and its rows do not
    depend on the other rows (one expert's rows alone give the same bits)."""
    from fp4_compile.codegen.invariant import linear_kernel as ik
    from fp4_compile.codegen.moe.grouped_mm import grouped_kernel

    w = _x(4, 48, 64, dtype=torch.float32, seed=41).to(torch.bfloat16)
    x = _x(29, 64, seed=42)
    offsets = torch.tensor([5, 5, 22, 29], dtype=torch.int32, device=DEV)
    y = grouped_kernel(x, w, offsets, torch.bfloat16)
    start = 0
    for i, end in enumerate(offsets.tolist()):
        if end > start:
            want = ik.linear(x[start:end], w[i], None, torch.bfloat16)
            assert_bitwise_equal(y[start:end], want, f"expert {i}")
        start = end
    alone = grouped_kernel(
        x[5:22], w, torch.tensor([0, 0, 17, 17], dtype=torch.int32, device=DEV), torch.bfloat16
    )
    assert_bitwise_equal(alone, y[5:22], "expert 2 alone vs in the batch")


def test_backward_kernels_store_16_bit_outputs_and_share_the_grad_amax():
    """Bitwise: dX / dW stored by the GEMMs in BF16 == their FP32 result cast by torch (one
    round-to-nearest-even either way; on CUDA the kernel's own cast); dgrad / wgrad given dY's
    per-tensor amax (`grad_amax`, one read for both) == computing it themselves; the grouped
    wgrad likewise."""
    from fp4_compile.codegen.nvfp4.grouped_wgrad_kernel import grouped_wgrad

    m, n, k = 40, 32, 48
    x, w = _x(m, k, seed=21), _x(n, k, dtype=torch.float32, seed=22)
    dy = _x(m, n, seed=23)
    wq = ref.quantize(w, block="16x16")
    sc = wq.block_scales.view(torch.uint8)
    amax = impl.grad_amax(dy, STRICT)
    assert_bitwise_equal(amax, dy.abs().amax().float(), "grad amax")
    dx32 = impl.cuda_dgrad(dy, wq.codes, sc, wq.global_decode, None, w, STRICT, 5)
    dx16 = impl.cuda_dgrad(
        dy,
        wq.codes,
        sc,
        wq.global_decode,
        None,
        w,
        STRICT,
        5,
        out_dtype=torch.bfloat16,
        dy_amax=amax,
    )
    assert dx16.dtype == torch.bfloat16
    assert_bitwise_equal(dx16, dx32.to(torch.bfloat16), "dX bf16")
    dw32 = impl.cuda_wgrad(dy, x, STRICT, 6)
    dw16 = impl.cuda_wgrad(dy, x, STRICT, 6, out_dtype=torch.bfloat16, dy_amax=amax)
    assert_bitwise_equal(dw16, dw32.to(torch.bfloat16), "dW bf16")
    offsets = torch.tensor([0, 11, 27, 40], dtype=torch.int32, device=DEV)
    g32 = grouped_wgrad(dy, x, offsets, STRICT, 99)
    g16 = grouped_wgrad(dy, x, offsets, STRICT, 99, out_dtype=torch.bfloat16)
    assert g16.dtype == torch.bfloat16
    assert_bitwise_equal(g16, g32.to(torch.bfloat16), "grouped dW bf16")


def test_device_held_seeds_draw_the_same_streams():
    """Bitwise: every stochastic-rounding consumer given its seed as an int64 [1] tensor on the
    device (what a CUDA-graph capture passes, `sr_stream.device_call_seed`) == the same seed as
    an int: the quantizer (packed and on-grid), the dense dgrad and wgrad, the MoE wgrad."""
    from fp4_compile.codegen.nvfp4.grouped_wgrad_kernel import grouped_wgrad
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton
    from fp4_compile.sr_stream import DeviceSeed

    assert STRICT.grad.rounding == "stochastic"
    seed = 2**62 + 5 * 4096
    t = torch.tensor([seed], dtype=torch.int64, device=DEV)
    x = _x(32, 64, dtype=torch.float32)
    kw = {"global_scale": "per_tensor", "rounding": "stochastic"}
    assert_nvfp4_equal(quantize_triton(x, seed=t, **kw), quantize_triton(x, seed=seed, **kw))
    og_t, _ = quantize_triton(x, seed=t, out="ongrid", **kw)
    og_i, _ = quantize_triton(x, seed=seed, out="ongrid", **kw)
    assert_bitwise_equal(og_t, og_i, "on-grid")
    with pytest.raises(ValueError, match="device seed must be an int64 tensor"):
        quantize_triton(x, seed=t.to(torch.int32), **kw)
    with pytest.raises(ValueError, match="seed must be an int in"):
        quantize_triton(x, seed=-1, **kw)
    # a DeviceSeed's host offset: the stream of seed + offset, no kernel to add it
    og_o, _ = quantize_triton(x, seed=DeviceSeed(t) + 3, out="ongrid", **kw)
    assert_bitwise_equal(og_o, quantize_triton(x, seed=seed + 3, out="ongrid", **kw)[0], "+3")
    dy, xs = _x(40, 32, seed=1), _x(40, 48, seed=2)
    assert_bitwise_equal(
        impl.cuda_wgrad(dy, xs, STRICT, DeviceSeed(t) + 1),
        impl.cuda_wgrad(dy, xs, STRICT, seed + 1),
        "wgrad",
    )
    assert_bitwise_equal(
        impl.cuda_wgrad(dy, xs, STRICT, t),
        impl.cuda_wgrad(dy, xs, STRICT, seed),
        "wgrad, tensor seed",
    )
    w = _x(32, 48, dtype=torch.float32, seed=3)
    wq = ref.quantize(w, block="16x16")
    args = (wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode, None, w, STRICT)
    assert_bitwise_equal(impl.cuda_dgrad(dy, *args, t), impl.cuda_dgrad(dy, *args, seed), "dgrad")
    offsets = torch.tensor([5, 5, 22, 40], dtype=torch.int32, device=DEV)
    assert_bitwise_equal(
        grouped_wgrad(dy, xs, offsets, STRICT, t),
        grouped_wgrad(dy, xs, offsets, STRICT, seed),
        "MoE wgrad",
    )
    assert_bitwise_equal(
        grouped_wgrad(dy, xs, offsets, STRICT, DeviceSeed(t) + 4096),
        grouped_wgrad(dy, xs, offsets, STRICT, seed + 4096),
        "MoE wgrad, offset",
    )


def test_next_device_seed_is_device_call_seed(monkeypatch):
    """Bitwise: the one-launch device seed (`device_seed_kernel.next_device_seed`) == the torch ops of
    `sr_stream.device_call_seed`, call after call, with the site's counter advanced alike; an
    unprepared site is the same clear error."""
    from fp4_compile import sr_stream
    from fp4_compile.codegen.nvfp4.device_seed_kernel import next_device_seed
    from fp4_compile.sr_stream import DeviceSeed, graph_site_key

    monkeypatch.setattr(sr_stream, "_device_counters", {})
    set_sr_state(None)
    a, b = 12345, 2**31 - 7
    with pytest.raises(RuntimeError, match="no device stochastic-rounding counter"):
        next_device_seed(a, DEV)
    sr_stream.prepare_device_counters([a, b], DEV)
    set_sr_state({graph_site_key(b): 2**24 - 2})  # the counter wraps in the seed's 24 bits
    for n in range(3):
        got = next_device_seed(a, DEV)
        assert isinstance(got, DeviceSeed) and got.offset == 0
        assert int(got.tensor) == nth_call_seed(graph_site_key(a), n)
        wrapped = next_device_seed(b, DEV)
        assert int(wrapped.tensor) == nth_call_seed(graph_site_key(b), 2**24 - 2 + n)
    assert int(sr_stream.device_call_seed(a, DEV)) == nth_call_seed(graph_site_key(a), 3)
    set_sr_state(None)


@pytest.mark.parametrize("act", ["per_row", "per_tensor"])
def test_grouped_forward_with_x_index_equals_gathered_copy(act):
    """Bitwise: the grouped forward reading x[x_index] through the index (x quantized once per
    row, the on-grid rows gathered by the GEMM's operand load) == the same call on the gathered
    copy; a token routed twice, one never routed (its row must not change a per-tensor amax),
    masked rows (index -1: zero rows), int32 and int64 indices, empty experts."""
    from fp4_compile.recipe import QuantSpec

    rec = NVFP4Recipe.strict(activation=QuantSpec(block="1x16", global_scale=act))
    e, n, k = 4, 32, 64
    w = _x(e, n, k, dtype=torch.float32, seed=3)
    wq = ref.quantize_experts(w)
    sc = wq.block_scales.view(torch.uint8)
    h = _x(12, k, seed=4)
    h[11] *= 1000.0  # never gathered: the largest row of h
    idx = torch.tensor([3, 0, 7, 7, 1, 2, 9, -1, 5, 4, 0, 8, 6, 3], device=DEV)
    offsets = torch.tensor([5, 5, 9, 14], dtype=torch.int32, device=DEV)
    args = (wq.codes, sc, wq.global_decode, None, None, rec, None)
    want = impl.cuda_linear(impl.gather_zero_rows(h, idx), *args, offsets=offsets)
    assert bool((want[7] == 0).all())
    for index in (idx, idx.to(torch.int32)):
        got = impl.cuda_linear(h, *args, offsets=offsets, x_index=index)
        assert_bitwise_equal(got, want, f"{index.dtype}")


def test_grouped_backward_with_x_index_equals_gathered_copy():
    """Bitwise: the backward op given x_index == the op on the gathered copy followed by
    `gather_rows_backward` (dX of the source rows; masked rows, index -1, add their zeroed
    gradients as the unfolded graph does), and the MoE wgrad reading X^T through the index ==
    the wgrad of the gathered copy."""
    from fp4_compile.codegen.invariant.gather_rows import gather_rows_backward
    from fp4_compile.codegen.nvfp4.grouped_wgrad_kernel import grouped_wgrad

    e, n, k = 4, 32, 48
    w = _x(e, n, k, dtype=torch.float32, seed=3)
    wq = ref.quantize_experts(w)
    h = _x(9, k, seed=12)
    idx = torch.tensor([3, 0, 7, 7, 1, 2, 5, 4, 0, 8, 6, 3, 1, 2, 5, 6], device=DEV)
    masked = torch.zeros(16, dtype=torch.bool, device=DEV)
    masked[[2, 9]] = True
    x_index = torch.where(masked, -1, idx)
    offsets = torch.tensor([5, 5, 11, 16], dtype=torch.int32, device=DEV)
    dy = _x(16, n, seed=11)
    seed = 2**40 + 4096
    xg = impl.gather_zero_rows(h, x_index)
    assert_bitwise_equal(
        grouped_wgrad(dy, h, offsets, STRICT, seed, x_index=x_index),
        grouped_wgrad(dy, xg, offsets, STRICT, seed),
        "wgrad",
    )
    wargs = (
        w,
        wq.codes,
        wq.block_scales.view(torch.uint8),
        wq.global_decode,
        offsets,
        None,
        STRICT.numerics_key,
        7,
        True,
        True,
    )
    set_sr_state(None)
    dh, dw = torch.ops.fp4_compile.nvfp4_grouped_mm_backward(dy, h, *wargs, x_index)
    set_sr_state(None)
    dxg, dw_g = torch.ops.fp4_compile.nvfp4_grouped_mm_backward(dy, xg, *wargs)
    assert dh.shape == h.shape
    want = gather_rows_backward(dxg.masked_fill(masked[:, None], 0.0), idx, h.shape[0])
    assert_bitwise_equal(dh, want, "dX of the source")
    assert_bitwise_equal(dw, dw_g, "dW")
    set_sr_state(None)


def test_gathered_zero_rows_share_a_nan_global_scale():
    """A shared (per-tensor) activation scale made NaN by a NaN in a gathered row: the zero
    rows (index -1) of the gathered forward are NaN too, as the gathered copy's zero rows are
    (0 * NaN), not +0.0."""
    rec = NVFP4Recipe.te()
    assert rec.activation.global_scale == "per_tensor"
    w = _x(2, 32, 64, dtype=torch.float32, seed=3)
    wq = ref.quantize_experts(w)
    h = _x(5, 64, seed=4)
    h[0, 3] = float("nan")
    idx = torch.tensor([0, -1, 3, 1, 2, 4], device=DEV)
    offsets = torch.tensor([2, 6], dtype=torch.int32, device=DEV)
    args = (wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode, None, None, rec, None)
    got = impl.cuda_linear(h, *args, offsets=offsets, x_index=idx)
    want = impl.cuda_linear(impl.gather_zero_rows(h, idx), *args, offsets=offsets)
    assert bool(torch.isnan(want[1]).all())
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert_bitwise_equal(got.nan_to_num(0.0), want.nan_to_num(0.0), "non-NaN values")


def test_narrow_configs_are_picked_by_width():
    """A dense GEMM of <= 512 output columns takes the narrow on-grid config beyond the small-M
    bucket; a wgrad of <= 512 weight rows its 512-row bucket; wider ones and the grouped MoE
    GEMMs do not."""
    from fp4_compile.codegen import configs

    narrow = configs.NARROW_N[("sm_90", "bf16", "nvfp4_gemm_ongrid")][1]
    assert configs.pick("sm_90", "bf16", "nvfp4_gemm_ongrid", 4096, n=512) == narrow
    assert configs.pick("sm_90", "bf16", "nvfp4_gemm_ongrid", 4096, n=2048) != narrow
    assert configs.pick("sm_90", "bf16", "nvfp4_gemm_ongrid", 4096) != narrow  # grouped: no n
    assert configs.pick("sm_90", "bf16", "nvfp4_gemm_ongrid", 16, n=512).block_m == 64  # small M
    assert configs.pick("sm_90", "bf16", "nvfp4_wgrad", 512).block_m == 64
    assert configs.pick("sm_90", "bf16", "nvfp4_wgrad", 1536).block_m == 128


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the sm_90 configs (CUDA)")
def test_narrow_configs_give_the_wide_configs_bits(monkeypatch):
    """Bitwise on the H200, cancellation-heavy rows: the narrow forward config (N = 512) ==
    the table's 128x256 tile, at M = 300 and 4096; the 512-row wgrad bucket == 128x256."""
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.nvfp4.gemm_kernel import launch_gemm
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    w = _x(512, 2048, dtype=torch.float32, seed=31)
    wq = quantize_triton(w.to(DEV), block="16x16", global_scale="per_tensor")
    w_og = wq.on_grid(torch.bfloat16)
    dy = _x(4096, 512, seed=33)
    for m in (300, 4096):
        x = _x(m, 2048, seed=32)
        a, gd_a = quantize_triton(x, global_scale="per_row", out="ongrid")
        narrow = launch_gemm(a, gd_a, w_og, wq.global_decode, out_dtype=torch.bfloat16)
        with monkeypatch.context() as mp:
            mp.setattr(configs, "NARROW_N", {})
            wide = launch_gemm(a, gd_a, w_og, wq.global_decode, out_dtype=torch.bfloat16)
        assert_bitwise_equal(narrow, wide, f"forward m={m}")
    x = _x(4096, 2048, seed=34)
    small = impl.cuda_wgrad(dy, x, STRICT, 5, out_dtype=torch.bfloat16)
    with monkeypatch.context() as mp:
        mp.setitem(
            configs.PINNED,
            ("sm_90", "bf16", "nvfp4_wgrad"),
            ((None, configs.TileConfig(128, 256, 64, num_warps=8, num_stages=3)),),
        )
        big = impl.cuda_wgrad(dy, x, STRICT, 5, out_dtype=torch.bfloat16)
    assert_bitwise_equal(small, big, "wgrad [512, 2048]")
