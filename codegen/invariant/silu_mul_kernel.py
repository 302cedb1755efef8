"""`fp4_compile::silu_mul` on CUDA as one Triton pass forward and one backward (the ATen path
takes 2 kernels forward and 4 backward, on the strided halves of the MoE gate_up output, with
ATen's unvectorized strided loop: about 0.6 ms of the learner step on the H200).

Shape legend: R rows (leading dims flattened), C the last dim; a and b have unit inner stride
and any row stride (the two halves of one [R, 2C] tensor).

The math is eager ATen's, operation for operation (aten/src/ATen/native/cuda/ActivationSiluKernel.cu
as nvcc compiles it: IEEE division, libdevice expf, `1 + x * (1 - s)` contracted into one FMA);
every other product is rounded on its own (`compile_options`: no FMA contraction):
  forward   s = rnd(a / (1 + exp(-a)));  out = rnd(s * b)
  backward  grad_b = rnd(grad * s);  g = rnd(grad * b);  sig = 1 / (1 + exp(-a));
            grad_a = rnd((g * sig) * fma(a, 1 - sig, 1))
rnd: to the tensor dtype (bf16: `round_bf16`, ties to even with integer ops; FP32: none).
Equal to ATen's bits on the H200 (torch 2.11, Triton 3.6; tests/codegen/invariant/test_silu_mul.py on CUDA,
bf16 and FP32, contiguous 2M-element inputs and strided halves, forward and backward:
`benchmarks/results/2026-12-04_pytest_cuda_2c9e3e9.log`); the op's contract (compiled == eager
lowered, learner == rollout) would hold even where they differed: both sides call this kernel."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ..configs import pick_launch, warps_kwargs
from ..runtime import check_kernel_device, compile_options, interpreting, row_mask_bytes
from ..triton_helpers import round_bf16

KERNEL_DTYPES = (torch.bfloat16, torch.float32)


@triton.jit
def _rnd(x, BF16: tl.constexpr):
    if BF16:
        return round_bf16(x)
    return x


@triton.jit
def _exp(x, INTERP: tl.constexpr):
    """expf: libdevice's (CUDA's accurate expf, as ATen's kernels call it), not Triton's
    `tl.exp` (ex2.approx); the interpreter has no libdevice and takes numpy's."""
    if INTERP:
        return tl.exp(x)
    return libdevice.exp(x)


@triton.jit
def _sigmoid(a, INTERP: tl.constexpr):
    return tl.math.div_rn(tl.full(a.shape, 1.0, tl.float32), 1.0 + _exp(-a, INTERP))


@triton.jit
def silu_mul_values(a, b, BF16: tl.constexpr, INTERP: tl.constexpr):
    """The forward's values, FP32 holding the output dtype's (module docstring): the one
    implementation of every kernel that computes silu(a) * b."""
    s = _rnd(tl.math.div_rn(a, 1.0 + _exp(-a, INTERP)), BF16)
    return _rnd(s * b, BF16)


@triton.jit
def _silu_mul_kernel(
    a_ptr,
    b_ptr,
    o_ptr,
    m_ptr,
    R,
    C,
    sa,
    sb,
    BF16: tl.constexpr,
    INTERP: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    ROW_MASK: tl.constexpr = False,
):
    # ROW_MASK: rows r with m[r] != 0 read a and b as zeros (the op on `x.masked_fill(m, 0)`'s
    # halves, without that copy: `passes/fold_row_masks.py`)
    rows = (tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < R)[:, None] & (cols < C)[None, :]
    lmask = mask
    if ROW_MASK:
        lmask = mask & (tl.load(m_ptr + rows, mask=rows < R, other=1) == 0)[:, None]
    a = tl.load(a_ptr + rows[:, None] * sa + cols[None, :], mask=lmask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows[:, None] * sb + cols[None, :], mask=lmask, other=0.0).to(tl.float32)
    out = silu_mul_values(a, b, BF16, INTERP)
    tl.store(o_ptr + rows[:, None] * C + cols[None, :], out.to(o_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _silu_mul_backward_kernel(
    g_ptr,
    a_ptr,
    b_ptr,
    ga_ptr,
    gb_ptr,
    m_ptr,
    R,
    C,
    sg,
    sa,
    sb,
    so,
    BF16: tl.constexpr,
    INTERP: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_C: tl.constexpr,
    ROW_MASK: tl.constexpr = False,
):
    # ROW_MASK: rows r with m[r] != 0 get +0.0 gradients (`masked_fill`'s backward), whatever
    # a, b and grad hold there. so: the row stride of both outputs (C: two [R, C] tensors; 2C:
    # the halves of one [R, 2C] gradient, `silu_mul_halves`)
    rows = (tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    cols = tl.program_id(1).to(tl.int64) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (rows < R)[:, None] & (cols < C)[None, :]
    c2 = cols[None, :]
    g = tl.load(g_ptr + rows[:, None] * sg + c2, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + rows[:, None] * sa + c2, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + rows[:, None] * sb + c2, mask=mask, other=0.0).to(tl.float32)
    s = _rnd(tl.math.div_rn(a, 1.0 + _exp(-a, INTERP)), BF16)
    grad_b = _rnd(g * s, BF16)
    gs = _rnd(g * b, BF16)
    sig = _sigmoid(a, INTERP)
    grad_a = _rnd((gs * sig) * tl.fma(a, 1.0 - sig, 1.0), BF16)
    if ROW_MASK:
        keep = (tl.load(m_ptr + rows, mask=rows < R, other=1) == 0)[:, None]
        grad_a = tl.where(keep, grad_a, 0.0)
        grad_b = tl.where(keep, grad_b, 0.0)
    out = rows[:, None] * so + c2
    tl.store(ga_ptr + out, grad_a.to(ga_ptr.dtype.element_ty), mask=mask)
    tl.store(gb_ptr + out, grad_b.to(gb_ptr.dtype.element_ty), mask=mask)


def kernel_applies(*tensors: torch.Tensor) -> bool:
    """CUDA, one dtype among KERNEL_DTYPES, last dim contiguous, rows of one stride each."""
    t0 = tensors[0]
    return (
        t0.device.type == "cuda"
        and t0.dtype in KERNEL_DTYPES
        and t0.dim() >= 1
        and t0.numel() > 0
        and all(t.dtype == t0.dtype and t.shape == t0.shape for t in tensors)
        and all(t.stride(-1) == 1 and _rows_view(t) is not None for t in tensors)
    )


def _rows_view(t: torch.Tensor):
    """t as [R, C] (a view, any row stride) or None when its leading dims do not flatten."""
    try:
        return t.view(-1, t.shape[-1]) if t.dim() != 2 else t
    except RuntimeError:
        return None


def _launch(r: int, c: int):
    """(grid, tile keywords, warps keywords) of both kernels: `configs.LAUNCH`'s "silu_mul"."""
    lc = pick_launch("any", "silu_mul")
    grid = (triton.cdiv(r, lc["block_r"]), triton.cdiv(c, lc["block_c"]))
    return grid, {"BLOCK_R": lc["block_r"], "BLOCK_C": lc["block_c"]}, warps_kwargs(lc)


def silu_mul_triton(a: torch.Tensor, b: torch.Tensor, row_mask=None) -> torch.Tensor:
    check_kernel_device(a, "a")
    a2, b2 = _rows_view(a), _rows_view(b)
    r, c = a2.shape
    m = row_mask_bytes(row_mask, r)
    out = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    grid, tile, warps = _launch(r, c)
    _silu_mul_kernel[grid](
        a2,
        b2,
        out,
        m if m is not None else out,
        r,
        c,
        a2.stride(0),
        b2.stride(0),
        BF16=a.dtype == torch.bfloat16,
        INTERP=interpreting(),
        **tile,
        ROW_MASK=m is not None,
        **warps,
        **compile_options(a.device),
    )
    return out


def silu_mul_backward_triton(grad, a, b, row_mask=None, *, into_halves=False):
    """(grad_a, grad_b); into_halves: ONE [R, 2C] tensor, grad_a its first half and grad_b its
    second (the gradient of the [R, 2C] tensor that a and b are the halves of)."""
    check_kernel_device(a, "a")
    g2, a2, b2 = _rows_view(grad), _rows_view(a), _rows_view(b)
    r, c = a2.shape
    m = row_mask_bytes(row_mask, r)
    if into_halves:
        whole = torch.empty((r, 2 * c), dtype=a.dtype, device=a.device)
        grad_a, grad_b = whole[:, :c], whole[:, c:]
    else:
        grad_a = torch.empty(a.shape, dtype=a.dtype, device=a.device)
        grad_b = torch.empty(b.shape, dtype=b.dtype, device=b.device)
    grid, tile, warps = _launch(r, c)
    _silu_mul_backward_kernel[grid](
        g2,
        a2,
        b2,
        grad_a,
        grad_b,
        m if m is not None else grad_a,
        r,
        c,
        g2.stride(0),
        a2.stride(0),
        b2.stride(0),
        2 * c if into_halves else c,
        BF16=a.dtype == torch.bfloat16,
        INTERP=interpreting(),
        **tile,
        ROW_MASK=m is not None,
        **warps,
        **compile_options(a.device),
    )
    return whole if into_halves else (grad_a, grad_b)
