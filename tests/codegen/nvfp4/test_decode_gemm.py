"""The decode GEMM kernel (packed weights, few rows; `nvfp4/decode_gemm_kernel.py`) in the Triton
interpreter (on a GPU: compiled).

Bitwise tier: with one-hot activation rows every output is ONE product (no accumulation order),
so the kernel's decoded weights (E2M1 by bit placement, the E4M3 scales folded with 2**118, the
2**-8 undone in the epilogue) and its epilogue must equal the exact reference for every weight:
all 16 codes, -0.0, subnormal and large block scales. Budget tier: random rows against the exact
reference, |y - y_ref| <= K * 2**-24 * (|a| @ |b|) * |gd_a gd_b| + 4 * 2**-24 * |y_ref|.
(The H200 check of decode rows == learner rows is tests/gpu/test_gpu_decode_gemm.py.)
"""

import os

import pytest
import torch

from fp4_compile import reference as ref
from fp4_compile.codegen.configs import DecodeConfig, decode_dispatch
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
U = 2.0**-24
# BLOCK_K 32: scale bytes, K masks off (K a multiple); 64: scale words (4 per 32-bit load);
# 128: scale words with the K masks on (K = 64 is not a multiple of 128); weights_right: the
# learner's operand orientation, with 32 and 16 weight rows (the wgmma's N there)
CONFIGS = [
    DecodeConfig(16, 32, 32, num_warps=1, num_stages=1),
    DecodeConfig(16, 32, 64, num_warps=1, num_stages=1),
    DecodeConfig(16, 32, 128, num_warps=1, num_stages=1),
    DecodeConfig(16, 32, 64, num_warps=1, num_stages=1, weights_right=True),
    DecodeConfig(16, 16, 64, num_warps=1, num_stages=1, weights_right=True),
]


def _launch(*args, **kwargs):
    from fp4_compile.codegen.nvfp4.decode_gemm_kernel import launch_decode_gemm

    return launch_decode_gemm(*args, **kwargs)


def _weights(e, n, k, seed):
    """Blocks whose magnitudes span 1e-7..1e2: subnormal E4M3 scales (and all-zero blocks) beside
    the largest ones; every code occurs, -0.0 included."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(max(e, 1) * n, k, generator=g) * torch.logspace(
        -7, 2, k // 16
    ).repeat_interleave(16)
    w[0, :16] = torch.tensor([0.0, -0.0, 0.5, -0.5, 1, -1, 1.5, -1.5, 2, -2, 3, -3, 4, -4, 6, -6])
    w = w.reshape(e, n, k) if e else w
    wq = ref.quantize_experts(w) if e else ref.quantize(w, block="16x16")
    return wq.to(DEV)


def _onehot_act(k, seed):
    """Rows that each hold one nonzero (a random value) at column j = row: [K, K], quantized."""
    g = torch.Generator().manual_seed(seed)
    x = torch.diag(torch.randn(k, generator=g) * 10.0)
    xq = ref.quantize(x, block="1x16", global_scale="per_row")
    return xq, xq.on_grid(torch.float32).to(DEV), xq.global_decode.to(DEV)


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_onehot_rows_equal_reference_bitwise(cfg):
    n, k = 48, 64
    wq = _weights(0, n, k, 1)
    xq, a, gd_a = _onehot_act(k, 2)
    bias = torch.randn(n).to(DEV)
    got = _launch(
        a,
        gd_a,
        (wq.codes, wq.block_scales.view(torch.uint8)),
        wq.global_decode,
        bias=bias,
        out_dtype=torch.float32,
        config=cfg,
    )
    want = ref.nvfp4_mm(xq, wq.to("cpu")) + bias.cpu()
    assert_bitwise_equal(got.cpu(), want, "one product per output")


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_grouped_gathered_onehot_rows_bitwise(cfg):
    """MoE: groups (an empty one too), rows gathered by index, -1 a zero row."""
    e, n, k = 3, 32, 64
    wq = _weights(e, n, k, 3)
    xq, a, gd_a = _onehot_act(k, 4)
    offs = torch.tensor([20, 20, 64], dtype=torch.int32, device=DEV)
    idx = torch.randperm(k, generator=torch.Generator().manual_seed(5))
    idx[[3, 40]] = -1
    got = _launch(
        a,
        gd_a,
        (wq.codes, wq.block_scales.view(torch.uint8)),
        wq.global_decode,
        out_dtype=torch.float32,
        offsets=offs,
        a_rows=idx.to(torch.int32).to(DEV),
        config=cfg,
    )
    wcpu = wq.to("cpu")
    start = 0
    for i, end in enumerate(offs.tolist()):
        rows = idx[start:end]
        xg = ref.quantize(
            torch.where(
                (rows >= 0)[:, None],
                torch.diag(torch.randn(k, generator=torch.Generator().manual_seed(4)) * 10.0)[
                    rows.clamp(min=0)
                ],
                0.0,
            ),
            block="1x16",
            global_scale="per_row",
        )
        want = ref.nvfp4_mm(xg, wcpu[i]) if end > start else torch.zeros(0, n)
        assert_bitwise_equal(got[start:end].cpu(), want, f"expert {i}")
        start = end


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_random_rows_within_fp32_budget(cfg):
    n, k, m = 48, 256, 5
    wq = _weights(0, n, k, 6)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(m, k, generator=g) * torch.logspace(-4, 2, k)
    xq = ref.quantize(x, block="1x16", global_scale="per_row")
    got = (
        _launch(
            xq.on_grid(torch.float32).to(DEV),
            xq.global_decode.to(DEV),
            (wq.codes, wq.block_scales.view(torch.uint8)),
            wq.global_decode,
            out_dtype=torch.float32,
            config=cfg,
        )
        .cpu()
        .double()
    )
    wcpu = wq.to("cpu")
    want = ref.nvfp4_mm(xq, wcpu).double()
    a, b = xq.on_grid(torch.float64), wcpu.on_grid(torch.float64)
    gd = (xq.global_decode.double() * wcpu.global_decode.double()).abs()
    budget = (a.abs() @ b.abs().t()) * gd * (k * U) + 4 * U * want.abs()
    assert bool(((got - want).abs() <= budget).all())


def test_bad_packed_weight_is_refused():
    wq = _weights(0, 32, 64, 8)
    a = torch.zeros(2, 32, device=DEV)
    with pytest.raises(ValueError, match="K=32"):
        _launch(
            a,
            torch.ones(2, 1, device=DEV),
            (wq.codes, wq.block_scales.view(torch.uint8)),
            wq.global_decode,
            out_dtype=torch.float32,
            config=CONFIGS[0],
        )


def test_interpreter_never_dispatches_to_decode():
    """In the interpreter launch_gemm keeps the learner's kernel (numpy's FP32 dot sums in an
    order that follows the operand layout); on sm_90 the pinned buckets serve few rows."""
    assert decode_dispatch("interpreter", 1) is None
    assert decode_dispatch("sm_90", 16) is not None


def test_sm90_refuses_configs_without_wgmma():
    """On sm_90 a config whose MMA left operand has < 64 rows would issue mma.sync (other
    rounding than the learner's wgmma): refused by name, never launched."""
    from fp4_compile.codegen.configs import check_decode_config

    check_decode_config("sm_90", DecodeConfig(16, 64, 128))
    check_decode_config("sm_90", DecodeConfig(64, 64, 128, weights_right=True))
    with pytest.raises(ValueError, match="tokens.*needs >= 64 rows"):
        check_decode_config("sm_90", DecodeConfig(16, 64, 128, weights_right=True))
    with pytest.raises(ValueError, match="weights.*needs >= 64 rows"):
        check_decode_config("sm_90", DecodeConfig(16, 32, 128))
