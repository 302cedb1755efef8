"""The NVFP4 GEMM kernels share one tile prologue and epilogue (`codegen/nvfp4/gemm_tile.py`):
the learner's GEMM, the decode GEMM and the split-K fold call its helpers and keep no copy of
their own, so the epilogue that decides the output's bits is one piece of code (issue 53 item 2).
The kernels' results are tested in test_decode_gemm.py / test_k_chunks.py / test_nvfp4_kernels.py;
this checks the structure those results rest on."""

import inspect

import pytest

pytest.importorskip("triton")

from fp4_compile.codegen.nvfp4 import decode_gemm_kernel, gemm_kernel, k_chunks  # noqa: E402

KERNELS = {
    "learner GEMM": gemm_kernel._nvfp4_gemm_kernel,
    "decode GEMM": decode_gemm_kernel._nvfp4_decode_gemm_kernel,
    "split-K fold": k_chunks._fold_chunks_kernel,
}


def _source(kernel) -> str:
    return inspect.getsource(getattr(kernel, "fn", kernel))


@pytest.mark.parametrize("name", KERNELS)
def test_kernel_uses_the_shared_tile_prologue_and_epilogue(name):
    src = _source(KERNELS[name])
    # the decode GEMM calls tile_epilogue's two halves: its prologue may hold the rows' gd_a
    # (A quantized in the kernel, `decode_gemm_prologue.py`)
    halves = ("row_global_decodes(", "scaled_store(")
    epilogue = halves if name == "decode GEMM" else ("tile_epilogue(",)
    for helper in ("tile_rows(", "gathered_rows(", *epilogue):
        assert src.count(helper) == 1, f"{name} must call gemm_tile.{helper[:-1]} once"
    # no copy of the epilogue's arithmetic or of the row gather outside the helpers
    for copy in ("gda[:, None]", "gda[None, :]", "expert_row_tile(", "a_rows_ptr + rows"):
        assert copy not in src, f"{name} keeps its own copy of {copy!r}"


def test_tile_epilogue_is_its_two_halves():
    from fp4_compile.codegen.nvfp4 import gemm_tile

    src = _source(gemm_tile.tile_epilogue)
    assert "row_global_decodes(" in src and "scaled_store(" in src
    assert "gda[" not in src and "tl.store(" not in src
