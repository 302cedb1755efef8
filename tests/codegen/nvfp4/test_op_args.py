"""The NVFP4 quantize ops' argument positions named in `codegen/nvfp4/op_args.py` are those of
the registered schemas (the GEMM ops': test_gemm_call.py) (bitwise tier not applicable: a
contract on names and positions)."""

import torch

from fp4_compile import codegen  # noqa: F401  (registers the ops)
from fp4_compile.codegen.nvfp4.op_args import QuantizeArg, QuantizeOut


def _positions(cls) -> dict[str, int]:
    return {k: v for k, v in vars(cls).items() if k.isupper()}


def _schema_index(op) -> dict[str, int]:
    return {a.name: i for i, a in enumerate(op.default._schema.arguments)}


def test_quantize_positions_match_schemas():
    ops = torch.ops.fp4_compile
    quantize, with_ongrid = _schema_index(ops.quantize), _schema_index(ops.quantize_with_ongrid)
    for name, pos in _positions(QuantizeArg).items():
        assert with_ongrid[name.lower()] == pos, name
        if name != "PACKED":
            assert quantize[name.lower()] == pos, name
    assert len(ops.quantize_with_ongrid.default._schema.returns) == QuantizeOut.ONGRID + 1
    assert len(ops.quantize.default._schema.returns) == QuantizeOut.ONGRID
