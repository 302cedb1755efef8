"""Argument and output positions of the NVFP4 ops' schemas, named once for the ops, the passes and
the backend (graph nodes carry positional args). The schemas themselves live in `quantize.py`,
`linear.py` and `grouped_linear.py` and do not change (exported artifacts and the op census depend
on them); tests/codegen/nvfp4/test_op_args.py checks every position here against the registered
schemas.

The GEMMs' string argument is the recipe's numerics key (`NVFP4Recipe.numerics_key`, decoded by
`NVFP4Recipe.from_numerics_key`); the schema calls it `recipe`, Python calls its position NUMERICS.
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


class GemmArg:
    """`fp4_compile::nvfp4_linear` and `::nvfp4_grouped_mm` (the same positions but 5)."""

    X = 0
    WEIGHT = 1
    W_CODES = 2
    W_SCALES = 3
    W_GLOBAL_DECODE = 4
    BIAS = 5  # nvfp4_linear
    OFFSETS = 5  # nvfp4_grouped_mm
    X_AMAX = 6
    NUMERICS = 7  # the schema's `recipe`: the recipe's numerics key
    W_ONGRID = 8
    SITE = 9
    X_INDEX = 10  # nvfp4_grouped_mm only
    X_PERM = 11  # nvfp4_grouped_mm only


# Python name -> the schema's argument name, where they differ.
SCHEMA_NAMES = {"NUMERICS": "recipe"}
