"""The decode GEMM (packed weights, few rows) on the H200: bitwise the learner's GEMM.

The learner multiplies on-grid BF16 weights in `gemm_kernel` (the 512-row call below takes its
large-M tile); the rollout's decode streams the packed weights through `decode_gemm_kernel`
(swapped operands, E2M1 by bit placement, weights scaled by 2**-8 inside). Every row of every
pinned decode bucket must equal the learner's row, on cancellation-heavy data (magnitudes
1e-4..1e2, both signs: where the 16-row mma.sync bucket once differed from wgmma), at every
split-K count (the K-chunked order, codegen/configs.py 1.: K = 8192 has 8 chunks).
"""

import gpu_internals as gi
import pytest
import torch

from fp4_compile.codegen.configs import DECODE, DecodeConfig, decode_dispatch, k_chunk
from fp4_compile.codegen.nvfp4.k_chunks import chunk_count
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
# the pinned configs, and the learner-orientation candidates of the sweep
CONFIGS = sorted(
    {cfg for _, cfg in DECODE["sm_90"]}
    | {
        DecodeConfig(64, w, k, num_stages=3, weights_right=True)
        for w in (64, 32, 16)
        for k in (128, 256)
    },
    key=str,
)


def _rows(m, k, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=g) * torch.logspace(-4, 2, k)).to(DEVICE)


def _ongrid_act(x):
    return gi.quantize_triton(
        x.to(torch.bfloat16), block="1x16", global_scale="per_row", out="ongrid"
    )


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("n, k", [(320, 2048), (1536, 2048), (2048, 768), (256, 8192)])
def test_decode_rows_equal_learner_rows(cfg, n, k):
    wq = gi.quantize_triton(_rows(n, k, 1), block="16x16", global_scale="per_tensor")
    a, gd_a = _ongrid_act(_rows(512, k, 2))
    bias = _rows(1, n, 3).reshape(n).to(torch.bfloat16)
    learner = gi.launch_gemm(
        a, gd_a, wq.on_grid(torch.bfloat16), wq.global_decode, bias=bias, out_dtype=torch.bfloat16
    )
    packed = (wq.codes, wq.block_scales.view(torch.uint8))
    chunks = chunk_count(k, k_chunk("sm_90", "nvfp4_gemm"))
    for m in (1, 2, 7, 15, 16, 17, 63, 64):
        for splits in sorted({None, *(s for s in (1, 2, 3, 4, 8) if s <= chunks)}, key=str):
            got = gi.launch_decode_gemm(
                a[:m],
                gd_a[:m],
                packed,
                wq.global_decode,
                bias=bias,
                out_dtype=torch.bfloat16,
                config=cfg,
                splits=splits,
            )
            assert_bitwise_equal(got, learner[:m], f"{cfg} {m}-row decode, splits={splits}")


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_grouped_decode_equals_learner(cfg):
    """MoE: experts' token groups (empty ones too) gathered by index (-1: a zero row)."""
    e, n, k = 6, 1536, 2048
    wq = gi.quantize_triton(
        _rows(e * n, k, 4).reshape(e, n, k), block="16x16", global_scale="per_expert"
    )
    a, gd_a = _ongrid_act(_rows(64, k, 5))
    offs = torch.tensor([3, 3, 19, 20, 36, 52], dtype=torch.int32, device=DEVICE)
    g = torch.Generator().manual_seed(6)
    rows = torch.randint(-1, 64, (52,), generator=g).to(torch.int32).to(DEVICE)
    learner = gi.launch_gemm(
        a,
        gd_a,
        wq.on_grid(torch.bfloat16),
        wq.global_decode,
        out_dtype=torch.float32,
        offsets=offs,
        rows_per_group=512,
        a_rows=rows,
    )
    chunks = chunk_count(k, k_chunk("sm_90", "nvfp4_gemm"))  # sm_90 pins one chain: 1 chunk
    for splits in (s for s in (1, 2) if s <= chunks):
        got = gi.launch_decode_gemm(
            a,
            gd_a,
            (wq.codes, wq.block_scales.view(torch.uint8)),
            wq.global_decode,
            out_dtype=torch.float32,
            offsets=offs,
            a_rows=rows,
            config=cfg,
            splits=splits,
        )
        assert_bitwise_equal(got, learner, f"{cfg} grouped decode, splits={splits}")


def test_dispatch_serves_decode_buckets_only():
    """launch_gemm sends packed GEMMs of up to the last bucket's rows to the decode kernel."""
    last = DECODE["sm_90"][-1][0]
    assert decode_dispatch("sm_90", 1) is not None
    assert decode_dispatch("sm_90", last) is not None
    assert decode_dispatch("sm_90", last + 1) is None
