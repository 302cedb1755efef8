"""`fp4_compile::nvfp4_grouped_mm_parts` (`nvfp4/grouped_parts.py`: the experts' GEMM on a
producer that left its codes to the GEMM) after `rms_norm_quantize_parts` (the normed tokens,
gathered by expert order) or `silu_mul_quantize_parts` on the halves of the gate/up output
(the down GEMM's rows), against the ops they replace: `add_rms_norm_quantize` /
`silu_mul_halves_quantize`, then `nvfp4_grouped_mm_quantized`.

Tier: bitwise (raw bytes). CPU: the references. Interpreter (the ops' kernel path forced on CPU
tensors, the interpreter made a decode architecture): the producer's first launch alone, then
the decode GEMM quantizing each gathered row in its prologue == the producer's split form
(row_codes included), then the experts' GEMM on its codes; with an on-grid weight, row_codes
then the GEMM; not a decode architecture, the codes' path. Rows of spread magnitudes, a zero
row, a token in two experts, an empty expert, a -1 (zero) row."""

import os

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.testing import assert_bitwise_equal

KEY = NVFP4Recipe.strict().numerics_key
ops = torch.ops.fp4_compile
INTERP = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()
# 6 tokens, top-2 over 3 experts (expert 1 empty), one -1 (a zero row)
INDEX = torch.tensor([0, 3, -1, 5, 1, 3, 2, 4, 5, 0], dtype=torch.int32)
OFFSETS = torch.tensor([4, 4, 10], dtype=torch.int32)


def _experts(e, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(e, n, k, generator=g) * torch.logspace(-3, 2, k // 16).repeat_interleave(16)
    wq = ref.quantize_experts(w)
    return wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode, wq


def _norm_inputs(m, h, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-3, 3, m)[:, None]
    x = (torch.randn(m, h, generator=g) * scale).to(dtype)
    r = (torch.randn(m, h, generator=g) * scale).to(dtype)
    x[1], r[1] = 0.0, 0.0
    w = (1.0 + 0.1 * torch.randn(h, generator=g)).to(dtype)
    return x, r, w


def _gate_up(rows, c, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 2 * c, generator=g) * torch.logspace(-2, 2, rows)[:, None]


def _old_norm(x, r, w, weight, w_og=None):
    y, a, gd, _, _, h = ops.add_rms_norm_quantize(x, r, w, 1e-6, KEY, False)
    out = ops.nvfp4_grouped_mm_quantized(
        y, y, *weight, OFFSETS, None, KEY, w_og, 0, INDEX, None, a, gd
    )
    return y, h, out


def _new_norm(x, r, w, weight, w_og=None):
    y, a, gd, parts, h = ops.rms_norm_quantize_parts(x, r, w, 1e-6, KEY)
    return y, h, ops.nvfp4_grouped_mm_parts(y, a, gd, parts, *weight, w_og, OFFSETS, INDEX)


def _old_silu(x, weight):
    y, a, gd = ops.silu_mul_halves_quantize(x, None, KEY)
    offsets = torch.tensor([3, 3, x.shape[0]], dtype=torch.int32)
    return y, ops.nvfp4_grouped_mm_quantized(
        y, y, *weight, offsets, None, KEY, None, 0, None, None, a, gd
    )


def _new_silu(x, weight, offsets=None, groups=1):
    c = x.shape[1] // 2
    y, a, gd, parts = ops.silu_mul_quantize_parts(x[:, :c], x[:, c:], None, KEY, groups)
    if offsets is None:
        offsets = torch.tensor([3, 3, x.shape[0]], dtype=torch.int32)
    return y, ops.nvfp4_grouped_mm_parts(y, a, gd, parts, *weight, None, offsets, None, groups)


def _check(got, want, names):
    for a, b, what in zip(got, want, names):
        assert_bitwise_equal(a, b, what)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_norm_then_experts_equals_old_ops_bitwise(dtype):
    x, r, w = _norm_inputs(6, 64, dtype, 0)
    codes, scales, gdw, _ = _experts(3, 48, 64, 1)
    weight = (codes, scales, gdw)
    _check(_new_norm(x, r, w, weight), _old_norm(x, r, w, weight), ("y", "h", "product"))


def test_cpu_swiglu_then_down_equals_old_ops_bitwise():
    codes, scales, gdw, _ = _experts(3, 48, 208, 2)
    x = _gate_up(7, 208, 3)
    _check(_new_silu(x, (codes, scales, gdw)), _old_silu(x, (codes, scales, gdw)), ("y", "down"))


def _kernel_path(monkeypatch, decode: bool):
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.nvfp4 import grouped_parts, norm_parts, silu_mul_parts

    dispatch = (*configs.DECODE_DISPATCH, "interpreter") if decode else configs.DECODE_DISPATCH
    monkeypatch.setattr(configs, "DECODE_DISPATCH", dispatch)
    for module in (norm_parts, silu_mul_parts, grouped_parts):
        monkeypatch.setattr(module, "_kernels", lambda t: True)


def _spy_prologue(monkeypatch):
    from fp4_compile.codegen.nvfp4 import decode_gemm_kernel

    calls, launch = [], decode_gemm_kernel.launch_decode_gemm

    def spy(*args, **kwargs):
        calls.append(kwargs.get("a_parts") is not None)
        return launch(*args, **kwargs)

    monkeypatch.setattr(decode_gemm_kernel, "launch_decode_gemm", spy)
    return calls


@pytest.mark.skipif(not INTERP, reason="the kernel path in the interpreter (GPU: tests/gpu)")
@pytest.mark.parametrize("ongrid", [False, True])
@pytest.mark.parametrize("decode", [True, False])
def test_kernel_path_norm_then_experts_bitwise(monkeypatch, decode, ongrid):
    from fp4_compile.codegen.nvfp4 import gemm, rms_norm_quantize

    x, r, w = _norm_inputs(6, 64, torch.float32, 4)
    codes, scales, gdw, wq = _experts(3, 32, 64, 5)
    w_og = wq.on_grid(torch.bfloat16) if ongrid else None
    _kernel_path(monkeypatch, decode)
    y, a, gd, _, _, h = rms_norm_quantize._cuda_operands(x, w, 1e-6, False, r)
    want = gemm.cuda_grouped_quantized(
        a, gd, codes, scales, gdw, w_og, OFFSETS, torch.float32, INDEX
    )
    calls = _spy_prologue(monkeypatch)
    got = _new_norm(x, r, w, (codes, scales, gdw), w_og)
    _check(got, (y.reshape(x.shape), h.reshape(x.shape), want), ("y", "h", "product"))
    assert any(calls) is (decode and not ongrid), calls  # the prologue ran where it should


@pytest.mark.skipif(not INTERP, reason="the kernel path in the interpreter (GPU: tests/gpu)")
@pytest.mark.parametrize("decode", [True, False])
def test_kernel_path_swiglu_then_down_bitwise(monkeypatch, decode):
    from fp4_compile.codegen.nvfp4 import gemm
    from fp4_compile.codegen.nvfp4.silu_mul_quantize_kernel import silu_mul_quantize as kernel

    codes, scales, gdw, _ = _experts(3, 32, 208, 6)
    x = _gate_up(7, 208, 7)
    _kernel_path(monkeypatch, decode)
    if decode:  # the split form, row_codes included
        y, og, gd, _ = kernel(x[:, :208], x[:, 208:], None, split=True)
    else:  # the codes' path: silu_mul_quantize's own (on CPU tensors its reference)
        y, og, gd, _, _ = ops.silu_mul_quantize(x[:, :208], x[:, 208:], None, KEY, False)
    offsets = torch.tensor([3, 3, 7], dtype=torch.int32)
    want = gemm.cuda_grouped_quantized(og, gd, codes, scales, gdw, None, offsets, y.dtype)
    calls = _spy_prologue(monkeypatch)
    _check(_new_silu(x, (codes, scales, gdw)), (y, want), ("y", "down"))
    assert any(calls) is decode, calls


@pytest.mark.skipif(not INTERP, reason="the kernel path in the interpreter (GPU: tests/gpu)")
@pytest.mark.parametrize("groups", [3, 1])
def test_kernel_path_swiglu_rows_past_buckets_per_expert_few(monkeypatch, groups):
    """Batch 64 x top-8 over 128 experts, scaled to the interpreter's decode bucket (64 rows):
    72 SwiGLU rows (past the bucket) over 3 experts (24 rows per expert, within it). groups = E:
    both sides decide on the rows per expert, the prologue quantizes; groups = 1: both on the 72
    rows, the codes' path (on CPU tensors silu_mul_quantize's reference). Bitwise the producer's
    codes (the split form's, row_codes included, or the reference's) then the experts' GEMM."""
    from fp4_compile.codegen.nvfp4 import gemm
    from fp4_compile.codegen.nvfp4.silu_mul_quantize_kernel import silu_mul_quantize as kernel

    codes, scales, gdw, _ = _experts(3, 32, 208, 10)
    x = _gate_up(72, 208, 11)
    x[5] = 0.0  # a zero row
    offsets = torch.tensor([20, 20, 72], dtype=torch.int32)  # expert 1 empty, expert 2: 52 rows
    _kernel_path(monkeypatch, True)
    if groups > 1:  # the split form, row_codes included
        y, og, gd, _ = kernel(x[:, :208], x[:, 208:], None, split=True)
    else:  # the codes' path: silu_mul_quantize's own (on CPU tensors its reference)
        y, og, gd, _, _ = ops.silu_mul_quantize(x[:, :208], x[:, 208:], None, KEY, False)
    want = gemm.cuda_grouped_quantized(og, gd, codes, scales, gdw, None, offsets, y.dtype)
    calls = _spy_prologue(monkeypatch)
    _check(_new_silu(x, (codes, scales, gdw), offsets, groups), (y, want), ("y", "down"))
    assert any(calls) is (groups == 3), calls


def test_fake_shapes_bad_parts_and_opcheck():
    x, r, w = _norm_inputs(6, 64, torch.float32, 8)
    codes, scales, gdw, _ = _experts(3, 48, 64, 9)
    y, a, gd, parts, _ = ops.rms_norm_quantize_parts(x, r, w, 1e-6, KEY)
    args = (y, a, gd, parts, codes, scales, gdw, None, OFFSETS, INDEX)
    out = ops.nvfp4_grouped_mm_parts(*args)
    assert out.shape == (INDEX.shape[0], 48) and out.dtype == x.dtype
    with pytest.raises(ValueError, match="x_parts"):
        ops.nvfp4_grouped_mm_parts(y, a, gd, parts[:2], *args[4:])
    torch.library.opcheck(ops.nvfp4_grouped_mm_parts.default, args)
    torch.library.opcheck(ops.nvfp4_grouped_mm_parts.default, (*args, 3))
    with pytest.raises(ValueError, match="groups"):
        ops.nvfp4_grouped_mm_parts(*args, 0)
