"""The decode GEMM quantizing its A operand in its prologue (`nvfp4/decode_gemm_prologue.py`) on
the GPU, bitwise: == row_codes then the decode GEMM (the two launches it replaces), == the
learner's GEMM rows (a 512-row call: the codes kernel's quantize, the large-M tile), at every
pinned decode bucket, dense and grouped with gathered rows; and nvfp4_linear's kernel path
(`gemm_cuda.cuda_linear`, which takes the prologue at few rows) == quantize_triton then
launch_gemm. Rows of magnitudes 1e-4..1e2, both signs (cancellation-heavy)."""

import gpu_internals as gi
import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.codegen.configs import DECODE
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
CONFIGS = sorted({cfg for _, cfg in DECODE["sm_90"]}, key=str)


def _rows(m, k, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.logspace(-4, 2, k)
    return x.to(torch.bfloat16).to(DEVICE)


def _target(x):
    from fp4_compile.codegen.runtime import kernel_target

    return kernel_target(x)


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("n, k", [(320, 2048), (2048, 768), (256, 8192)])
def test_prologue_equals_row_codes_gemm_and_learner(cfg, n, k):
    wq = gi.quantize_triton(_rows(n, k, 1).float(), block="16x16", global_scale="per_tensor")
    packed = (wq.codes, wq.block_scales.view(torch.uint8))
    y = _rows(512, k, 2)
    a, gd_a = gi.quantize_triton(y, block="1x16", global_scale="per_row", out="ongrid")
    learner = gi.launch_gemm(
        a, gd_a, wq.on_grid(torch.bfloat16), wq.global_decode, out_dtype=torch.bfloat16
    )
    for m in (1, 2, 7, 16, 17, 64):
        ym = y[:m].contiguous()
        parts = gi.chunk_abs_max(ym, target=_target(ym))
        ongrid, gd, _ = gi.row_codes_from_parts(ym, parts, target=_target(ym))
        two = gi.launch_decode_gemm(
            ongrid, gd, packed, wq.global_decode, out_dtype=torch.bfloat16, config=cfg
        )
        one = gi.launch_decode_gemm(
            ym,
            None,
            packed,
            wq.global_decode,
            out_dtype=torch.bfloat16,
            config=cfg,
            a_parts=parts,
        )
        assert_bitwise_equal(one, two, f"{cfg} m={m}: prologue vs row_codes + GEMM")
        assert_bitwise_equal(one, learner[:m], f"{cfg} m={m}: prologue vs learner rows")


def test_grouped_gathered_prologue_equals_row_codes_gemm():
    k, n, e = 2048, 256, 4
    w = _rows(e * n, k, 3).float().reshape(e, n, k)
    wq = gi.quantize_triton(w, block="16x16", global_scale="per_expert")
    packed = (wq.codes, wq.block_scales.view(torch.uint8))
    y = _rows(9, k, 4)
    idx = torch.tensor([0, 3, -1, 5, 1, 3, 2, 4, 8, 0, 7, 6, -1, 2], device=DEVICE)
    offs = torch.tensor([4, 4, 10, 14], dtype=torch.int32, device=DEVICE)
    parts = gi.chunk_abs_max(y, target=_target(y))
    ongrid, gd, _ = gi.row_codes_from_parts(y, parts, target=_target(y))
    kw = dict(out_dtype=torch.bfloat16, offsets=offs, a_rows=idx, rows_per_group=4)
    two = gi.launch_decode_gemm(ongrid, gd, packed, wq.global_decode, **kw)
    one = gi.launch_decode_gemm(y, None, packed, wq.global_decode, a_parts=parts, **kw)
    assert_bitwise_equal(one, two, "grouped, gathered rows")


@pytest.mark.parametrize("m", [1, 16, 64])
def test_cuda_linear_few_rows_equals_quantize_then_gemm(m):
    k, n = 4096, 1024
    wq = gi.quantize_triton(_rows(n, k, 5).float(), block="16x16", global_scale="per_tensor")
    packed = (wq.codes, wq.block_scales.view(torch.uint8))
    x = _rows(m, k, 6)
    assert gi.nvfp4_gemm.few_row_parts(x, "per_row", packed, m) is not None
    got = gi.nvfp4_gemm.cuda_linear(
        x, *packed, wq.global_decode, None, None, NVFP4Recipe.strict(), None
    )
    a, gd_a = gi.quantize_triton(x, block="1x16", global_scale="per_row", out="ongrid")
    want = gi.launch_gemm(a, gd_a, packed, wq.global_decode, out_dtype=x.dtype, rows_per_group=m)
    assert_bitwise_equal(got, want, f"m={m}")
