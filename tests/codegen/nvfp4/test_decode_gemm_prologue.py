"""The decode GEMM that quantizes its A operand in its prologue (`nvfp4/decode_gemm_prologue.py`,
`launch_decode_gemm(..., a_parts=)`) against the two launches it replaces, `row_codes_from_parts`
then the decode GEMM on its output. In the Triton interpreter (on a GPU: compiled).

Tier: bitwise (raw bytes). Rows of spread magnitudes (so that the block scales span the E4M3
range), an all-zero row, BF16 and FP32 values; dense, grouped with gathered rows (-1 a zero
row, a token in two experts, an empty expert), and split K (the interpreter's KC 128: K 256 is
two chunks). Structure: the prologue calls row_codes' own jit helpers, no copy of them."""

import inspect
import os

import pytest
import torch

from fp4_compile import reference as ref
from fp4_compile.codegen.configs import DecodeConfig
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
K = 256
CONFIGS = [
    DecodeConfig(16, 32, 64, num_warps=1, num_stages=1),
    DecodeConfig(16, 32, 128, num_warps=1, num_stages=1),
    DecodeConfig(16, 16, 64, num_warps=1, num_stages=1, weights_right=True),
]


def _kernels():
    from fp4_compile.codegen.nvfp4 import decode_gemm_kernel, row_codes_kernel
    from fp4_compile.codegen.nvfp4.abs_max_kernel import chunk_abs_max
    from fp4_compile.codegen.runtime import kernel_target

    return decode_gemm_kernel.launch_decode_gemm, row_codes_kernel, chunk_abs_max, kernel_target


def _rows(m, k, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(m, k, generator=g) * torch.logspace(-6, 3, k)[torch.randperm(k, generator=g)]
    y[1] = 0.0
    return y.to(dtype).to(DEV)


def _weight(e, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(max(e, 1) * n, k, generator=g) * torch.logspace(
        -3, 2, k // 16
    ).repeat_interleave(16)
    wq = ref.quantize_experts(w.reshape(e, n, k)) if e else ref.quantize(w, block="16x16")
    return wq.to(DEV)


def _both(y, wq, **kwargs):
    """(row_codes then the decode GEMM, the GEMM quantizing in its prologue)."""
    launch, row_codes, chunk_abs_max, kernel_target = _kernels()
    target = kernel_target(y)
    parts = chunk_abs_max(y, target=target)
    ongrid, gd, _ = row_codes.row_codes_from_parts(y, parts, target=target)
    b = (wq.codes, wq.block_scales.view(torch.uint8))
    want = launch(ongrid, gd, b, wq.global_decode, out_dtype=torch.float32, **kwargs)
    got = launch(y, None, b, wq.global_decode, out_dtype=torch.float32, a_parts=parts, **kwargs)
    return got.cpu(), want.cpu()


@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_dense_prologue_equals_row_codes_then_gemm_bitwise(cfg, dtype, splits):
    wq = _weight(0, 48, K, 1)
    y = _rows(5, K, dtype, 2)
    bias = torch.randn(48, generator=torch.Generator().manual_seed(3)).to(DEV)
    got, want = _both(y, wq, bias=bias, config=cfg, splits=splits)
    assert_bitwise_equal(got, want, f"{cfg} {dtype} splits={splits}")


@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("cfg", CONFIGS[:2], ids=str)
def test_grouped_gathered_prologue_equals_row_codes_then_gemm_bitwise(cfg, splits):
    wq = _weight(3, 32, K, 4)
    y = _rows(6, K, torch.bfloat16, 5)
    idx = torch.tensor([0, 3, -1, 5, 1, 3, 2, 4, -1, 0], dtype=torch.int32, device=DEV)
    offs = torch.tensor([4, 4, 10], dtype=torch.int32, device=DEV)
    got, want = _both(y, wq, offsets=offs, a_rows=idx, rows_per_group=4, config=cfg, splits=splits)
    assert_bitwise_equal(got, want, f"{cfg} splits={splits}")


def test_k_not_a_multiple_of_block_k_bitwise():
    """K = 80: the K masks of the prologue's load (five 16-blocks, BLOCK_K 64)."""
    wq = _weight(0, 32, 80, 6)
    y = _rows(3, 80, torch.bfloat16, 7)
    got, want = _both(y, wq, config=CONFIGS[0])
    assert_bitwise_equal(got, want, "K = 80")


def test_prologue_calls_row_codes_helpers():
    _, row_codes, _, _ = _kernels()
    from fp4_compile.codegen.nvfp4 import decode_gemm_prologue

    src = inspect.getsource(decode_gemm_prologue)
    kernel_src = inspect.getsource(row_codes._row_codes_kernel.fn)
    for helper in ("row_scales_from_parts(", "ongrid_blocks("):
        assert helper in src and helper in kernel_src, helper
    for copy in ("scales_from_amax(", "block_encode(", "rne_ongrid_magnitude("):
        assert copy not in src and copy not in kernel_src, f"a copy of {copy!r}"


def test_bad_parts_are_refused():
    launch, *_ = _kernels()
    wq = _weight(0, 32, 64, 8)
    y = _rows(2, 64, torch.bfloat16, 9)
    b = (wq.codes, wq.block_scales.view(torch.uint8))
    with pytest.raises(ValueError, match="a_parts"):
        launch(y, None, b, wq.global_decode, out_dtype=torch.float32, a_parts=torch.ones(3, 1))


@pytest.mark.parametrize("grouped", [False, True])
def test_cuda_linear_takes_the_prologue_bitwise(monkeypatch, grouped):
    """`gemm_cuda.cuda_linear` (nvfp4_linear's kernel path) at few rows: chunk maxima, then the
    decode GEMM quantizing in its prologue, bitwise quantize_triton's split form (chunk maxima,
    row_codes) then launch_gemm's decode GEMM. The interpreter is made a decode architecture
    for both sides (it is not one: its FP32 dot sums a transposed operand in numpy's order)."""
    from fp4_compile import NVFP4Recipe
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.nvfp4 import gemm_cuda
    from fp4_compile.codegen.nvfp4.gemm_kernel import launch_gemm
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    monkeypatch.setattr(configs, "DECODE_DISPATCH", (*configs.DECODE_DISPATCH, "interpreter"))
    x = _rows(6, K, torch.float32, 10)
    wq = _weight(3 if grouped else 0, 32, K, 11)
    b = (wq.codes, wq.block_scales.view(torch.uint8))
    kwargs, rows = {}, 6
    if grouped:
        idx = torch.tensor([0, 3, -1, 5, 1, 3, 2, 4, -1, 0], dtype=torch.int32, device=DEV)
        offs = torch.tensor([4, 4, 10], dtype=torch.int32, device=DEV)
        kwargs, rows = dict(offsets=offs, x_index=idx), 4
    assert gemm_cuda.few_row_parts(x, "per_row", b, rows) is not None  # the path is taken
    bias = None if grouped else torch.randn(32, generator=torch.Generator().manual_seed(12))
    bias = bias.to(DEV) if bias is not None else None
    got = gemm_cuda.cuda_linear(
        x, *b, wq.global_decode, None, bias, NVFP4Recipe.strict(), None, **kwargs
    )
    a, gd_a = quantize_triton(x, block="1x16", global_scale="per_row", out="ongrid")
    want = launch_gemm(
        a,
        gd_a,
        b,
        wq.global_decode,
        bias=bias,
        out_dtype=x.dtype,
        offsets=kwargs.get("offsets"),
        rows_per_group=rows,
        a_rows=kwargs.get("x_index"),
    )
    assert_bitwise_equal(got.cpu(), want.cpu(), f"grouped={grouped}")
