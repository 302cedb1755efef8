"""The NVFP4 family's references: `fp4_compile/reference.py`, re-exported here so that every
codegen family has its `reference.py` (plain PyTorch, no Triton, runs on CPU). That module's
docstring writes out the scale chain step by step (amax -> global encode / decode -> E4M3 block
scales -> E2M1 codes, and which roundings must not be merged); the kernels of this folder are
bitwise equal to it (tests/codegen/nvfp4/). The CPU paths of the GEMM ops compose these functions
(`nvfp4/gemm.py`).

`chunked_dot_ongrid` states the Triton GEMMs' K summation order (configs.py 1., `k_chunks.py`)
for chunk partials computed exactly: the order the kernels' fold follows, checked bitwise in the
interpreter on data whose chunk sums every order computes exactly.
"""

import torch

from ...reference import (
    INPUT_DTYPES,
    apply_global_scales,
    check_offsets,
    dequantize,
    e2m1_round_rne,
    e2m1_round_stochastic,
    exact_dot_fp32,
    exact_dot_ongrid,
    global_amax,
    global_encode_from_amax,
    global_scales,
    group_amax,
    nvfp4_grouped_mm,
    nvfp4_mm,
    quantize,
    quantize_experts,
    validate_input,
)


def chunked_dot_ongrid(a_ongrid: torch.Tensor, b_ongrid: torch.Tensor, kc: int) -> torch.Tensor:
    """a [M, K] @ b [N, K]^T in the GEMMs' chunked order: the exact dot product of every KC-long
    chunk of K rounded to FP32 once (p_c), then ((p_0 + p_1) + p_2) + ... in FP32 from p_0.
    kc <= 0: one chunk (= `exact_dot_ongrid`). FP32 [M, N]."""
    k = a_ongrid.shape[-1]
    if b_ongrid.shape[-1] != k:
        raise ValueError(f"a {tuple(a_ongrid.shape)} and b {tuple(b_ongrid.shape)}: K differs")
    step = k if kc <= 0 else kc
    total = None
    for k0 in range(0, max(k, 1), step):
        part = exact_dot_ongrid(a_ongrid[..., k0 : k0 + step], b_ongrid[..., k0 : k0 + step])
        total = part if total is None else total + part
    return total


__all__ = [
    "INPUT_DTYPES",
    "chunked_dot_ongrid",
    "apply_global_scales",
    "check_offsets",
    "dequantize",
    "e2m1_round_rne",
    "e2m1_round_stochastic",
    "exact_dot_fp32",
    "exact_dot_ongrid",
    "global_amax",
    "global_encode_from_amax",
    "global_scales",
    "group_amax",
    "nvfp4_grouped_mm",
    "nvfp4_mm",
    "quantize",
    "quantize_experts",
    "validate_input",
]
