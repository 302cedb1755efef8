"""`fp4_compile::invariant_attention_parts` (the decode attention with each head's max |out|,
the output projection's partial row maxima) and `fp4_compile::nvfp4_linear_with_parts` (the
projection reading them).

Tier: bitwise. The op's (out, lse) == `invariant_attention`'s, and its parts == each head's
max |out| of that out (as stored, BF16; NaN where the head's row holds one), on CPU and in the
kernel's epilogue (CUDA, else the Triton interpreter); folded per row (the decode GEMM
prologue's max), the parts == `chunk_abs_max`'s of o_proj's operand folded alike. Decode shapes
(Tq = 1), grouped heads, rows of different kv_len, a static cache with junk past each length,
a NaN value; `nvfp4_linear_with_parts` == `nvfp4_linear` on CPU, and on the kernel path the
decode GEMM on the given parts == on chunk_abs_max's (tests/gpu/test_gpu_attention_parts.py).
"""

from __future__ import annotations

import os

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.testing import assert_bitwise_equal

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ops = torch.ops.fp4_compile
KEY = NVFP4Recipe.strict().numerics_key


def _decode(b=3, hq=8, hkv=2, tk=40, d=32, seed=0, nan=False):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, 1, d, generator=g).bfloat16()
    k = torch.randn(b, hkv, tk, d, generator=g).bfloat16()
    v = (torch.randn(b, hkv, tk, d, generator=g) * 4).bfloat16()
    kv_len = torch.tensor([tk, 17, 1][:b], dtype=torch.int32)
    k[1, :, 17:] = 1e4  # junk past row 1's length (never read)
    if nan:
        v[0, hkv - 1, 3, 5] = float("nan")  # every head of the last group of token 0 reads it
    q_start = kv_len - 1
    return q, k, v, q_start, kv_len


def _heads_max(out):
    """Each (token, head)'s max |out| FP32 [B * Tq, Hq], NaN where its row holds one."""
    heads = out.transpose(1, 2).reshape(-1, out.shape[1], out.shape[3]).float()
    return heads.abs().amax(dim=2).masked_fill(heads.isnan().any(dim=2), float("nan"))


def _fold(parts):
    """The decode GEMM prologue's fold of a row's parts (`row_scales_from_parts`)."""
    amax = torch.where(parts.isnan(), 0.0, parts).amax(dim=1)
    return amax.masked_fill(parts.isnan().any(dim=1), float("nan"))


@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan"])
@pytest.mark.parametrize(("hq", "hkv"), [(8, 2), (4, 4), (16, 1)])
def test_op_equals_attention_and_its_heads_maxima(hq, hkv, nan):
    case = [t.to(DEV) for t in _decode(hq=hq, hkv=hkv, nan=nan)]
    out, lse, parts = ops.invariant_attention_parts(*case, None, False, 0.25)
    want_out, want_lse = ops.invariant_attention(*case, None, False, 0.25)
    assert_bitwise_equal(out, want_out, "out")
    assert_bitwise_equal(lse, want_lse, "lse")
    assert parts.shape == (3, hq) and parts.dtype == torch.float32
    assert_bitwise_equal(parts, _heads_max(want_out), "parts")
    assert parts.isnan().any().item() is nan


@pytest.mark.parametrize("nan", [False, True], ids=["finite", "nan"])
@pytest.mark.parametrize(("hq", "hkv"), [(8, 2), (32, 4)])
def test_kernel_epilogue_parts(hq, hkv, nan):
    """The kernel with row_parts (CUDA or the interpreter): out and lse as without, parts the
    heads' maxima of that out, and folded per row == chunk_abs_max's parts folded."""
    pytest.importorskip("triton")
    if DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    from fp4_compile.codegen.invariant.attention_kernel import attention
    from fp4_compile.codegen.nvfp4.abs_max_kernel import chunk_abs_max
    from fp4_compile.codegen.runtime import kernel_target

    q, k, v, q_start, kv_len = (t.to(DEV) for t in _decode(hq=hq, hkv=hkv, d=64, nan=nan))
    out, lse, parts = attention(q, k, v, q_start, kv_len, None, False, 0.125, row_parts=True)
    want_out, want_lse = attention(q, k, v, q_start, kv_len, None, False, 0.125)
    assert_bitwise_equal(out, want_out, "out")
    assert_bitwise_equal(lse, want_lse, "lse")
    assert_bitwise_equal(parts, _heads_max(out), "parts")
    x2 = out.transpose(1, 2).reshape(out.shape[0], -1).contiguous()
    chunks = chunk_abs_max(x2, target=kernel_target(x2))
    assert_bitwise_equal(_fold(parts), _fold(chunks), "folded row maxima")


def test_kernel_refuses_parts_off_decode():
    pytest.importorskip("triton")
    if DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    from fp4_compile.codegen.invariant.attention_kernel import attention

    q, k, v, q_start, kv_len = (t.to(DEV) for t in _decode())
    q2 = torch.cat([q, q], dim=2)
    with pytest.raises(ValueError, match="Tq = 1"):
        attention(q2, k, v, q_start - 1, kv_len, None, True, 0.125, row_parts=True)


def _weights(n, k, seed=1):
    g = torch.Generator().manual_seed(seed)
    wq = ref.quantize(torch.randn(n, k, generator=g), block="16x16")
    return wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode


def test_linear_with_parts_equals_nvfp4_linear():
    """CPU: nvfp4_linear_with_parts == nvfp4_linear's forward (the parts unread)."""
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 1, 256, generator=g) * torch.logspace(-2, 2, 3)[:, None, None]).bfloat16()
    weight = torch.randn(48, 256, generator=g)
    codes, scales, gd = _weights(48, 256)
    parts = _heads_max(x.reshape(3, 1, 8, 32).transpose(1, 2))
    got = ops.nvfp4_linear_with_parts(x, parts, codes, scales, gd, None, None, KEY)
    want = ops.nvfp4_linear(x, weight, codes, scales, gd, None, None, KEY, None, 0)
    assert_bitwise_equal(got, want, "y")
    with pytest.raises(ValueError, match="x_parts"):
        ops.nvfp4_linear_with_parts(x, parts[:2], codes, scales, gd, None, None, KEY)


def test_opcheck():
    """Schema and fake agree with the dispatch (no autograd: inference graphs only)."""
    case = _decode()
    torch.library.opcheck(
        ops.invariant_attention_parts.default,
        (*case, None, False, 0.25),
        test_utils=("test_schema", "test_faketensor"),
    )
    x = torch.randn(3, 1, 64).bfloat16()
    codes, scales, gd = _weights(16, 64)
    torch.library.opcheck(
        ops.nvfp4_linear_with_parts.default,
        (x, _heads_max(x.reshape(3, 1, 2, 32).transpose(1, 2)), codes, scales, gd, None, None, KEY),
        test_utils=("test_schema", "test_faketensor"),
    )


def test_decode_gemm_on_given_parts_equals_on_chunk_maxima(monkeypatch):
    """`gemm_cuda.cuda_linear` (nvfp4_linear_with_parts' kernel path) at a decode: the decode
    GEMM's prologue on per-head maxima == on its own chunk_abs_max parts, bitwise (CUDA, or the
    interpreter made a decode architecture for both sides)."""
    pytest.importorskip("triton")
    if DEV == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.nvfp4 import gemm_cuda

    monkeypatch.setattr(configs, "DECODE_DISPATCH", (*configs.DECODE_DISPATCH, "interpreter"))
    g = torch.Generator().manual_seed(4)
    dtype = torch.bfloat16 if DEV == "cuda" else torch.float32  # the interpreter's casts
    x = (torch.randn(3, 512, generator=g) * torch.logspace(-3, 3, 3)[:, None]).bfloat16()
    x = x.to(dtype).to(DEV)
    codes, scales, gd = (t.to(DEV) for t in _weights(64, 512))
    parts = _heads_max(x.reshape(3, 1, 16, 32).transpose(1, 2))
    assert gemm_cuda.few_row_parts(x, "per_row", (codes, scales), 3, given=parts) is parts
    rec = NVFP4Recipe.strict()
    got = gemm_cuda.cuda_linear(x, codes, scales, gd, None, None, rec, None, x_parts=parts)
    want = gemm_cuda.cuda_linear(x, codes, scales, gd, None, None, rec, None)
    assert_bitwise_equal(got.cpu(), want.cpu(), "y")
