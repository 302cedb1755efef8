"""The NVFP4 family's references: `fp4_compile/reference.py`, re-exported here so that every
codegen family has its `reference.py` (plain PyTorch, no Triton, runs on CPU). That module's
docstring writes out the scale chain step by step (amax -> global encode / decode -> E4M3 block
scales -> E2M1 codes, and which roundings must not be merged); the kernels of this folder are
bitwise equal to it (tests/codegen/nvfp4/). The CPU paths of the GEMM ops compose these functions
(`nvfp4/gemm.py`)."""

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

__all__ = [
    "INPUT_DTYPES",
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
