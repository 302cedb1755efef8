"""The decode GEMM kernel (`nvfp4/decode_gemm_kernel.py`) over a fused group's weight buffer
(`passes/fuse_group_gemms.py`): q/k/v packed as row ranges of one codes / scale buffer
[N_total, K/2], [N_total, K/16], sharing one global scale. In the Triton interpreter (on a GPU:
compiled).

Tier: bitwise. Each member's columns of the one launch over N_total equal, raw bytes, the launch
over that member's rows alone: a column's K chain (its K chunks, each from zero, folded in one
order) depends on K alone, not on N, the weight tile a row falls in or the split count that
N_total changes. Member sizes that do not fill whole weight tiles included (the tiles of the
fused launch straddle members).
"""

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
K = 256  # two K chunks in the interpreter (KC 128): split counts 1 and 2
MEMBERS = {"q": 48, "k": 16, "v": 32}  # q straddles the 32-row weight tiles of the fused launch
CONFIGS = [
    DecodeConfig(16, 32, 64, num_warps=1, num_stages=1),
    DecodeConfig(16, 32, 128, num_warps=1, num_stages=1),
    DecodeConfig(16, 32, 64, num_warps=1, num_stages=1, weights_right=True),
]


def _launch(*args, **kwargs):
    from fp4_compile.codegen.nvfp4.decode_gemm_kernel import launch_decode_gemm

    return launch_decode_gemm(*args, **kwargs)


def _group_weight():
    """The members' rows quantized with one global scale (the group's amax) and 16x16 blocks
    that never straddle two members: rows of one NVFP4 tensor [N_total, K]."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(sum(MEMBERS.values()), K, generator=g)
    w = w * torch.logspace(-3, 2, K // 16).repeat_interleave(16)
    return ref.quantize(w, block="16x16").to(DEV)


@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
def test_fused_launch_columns_equal_each_members_launch_bitwise(cfg, splits):
    wq = _group_weight()
    codes, scales = wq.codes, wq.block_scales.view(torch.uint8)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, K, generator=g) * torch.logspace(-4, 2, K)
    xq = ref.quantize(x, block="1x16", global_scale="per_row")
    a, gd_a = xq.on_grid(torch.float32).to(DEV), xq.global_decode.to(DEV)

    def launch(rows: slice):
        return _launch(
            a,
            gd_a,
            (codes[rows], scales[rows]),
            wq.global_decode,
            out_dtype=torch.float32,
            config=cfg,
            splits=splits,
        )

    fused = launch(slice(None))
    assert fused.shape == (5, sum(MEMBERS.values())) and bool(fused.ne(0).all())
    start = 0
    for name, n in MEMBERS.items():
        alone = launch(slice(start, start + n))
        assert_bitwise_equal(fused[:, start : start + n].cpu(), alone.cpu(), f"{name} ({cfg})")
        start += n
