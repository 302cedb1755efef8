"""Argument and output positions of the NVFP4 quantize ops' schemas, named once for the ops, the
passes and the backend (graph nodes carry positional args). The schemas themselves live in
`quantize.py` and do not change (exported artifacts and the op census depend on them);
tests/codegen/nvfp4/test_op_args.py checks every position here against the registered schemas.
The GEMM ops' arguments are ordered in one place of their own, `gemm_call.GemmCall`.
"""


class QuantizeArg:
    """`fp4_compile::quantize` and `::quantize_with_ongrid` (which adds PACKED)."""

    X = 0
    BLOCK = 1
    GLOBAL_SCALE = 2
    STATIC_AMAX = 3
    ROUNDING = 4
    SEED = 5
    PACKED = 6  # quantize_with_ongrid only: False = the on-grid copy alone, no packed bytes


class QuantizeOut:
    """Outputs of `quantize` (the first three) and `quantize_with_ongrid` (all four)."""

    CODES = 0
    BLOCK_SCALES = 1
    GLOBAL_DECODE = 2
    ONGRID = 3
