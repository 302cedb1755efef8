"""Fixed-order arithmetic for the batch-invariant CPU ops (plain PyTorch, no Triton).

Why these are batch-invariant BY CONSTRUCTION: stock CPU kernels may change the reduction order
of a row with the batch size or the thread count (a reduction split over threads, gemv vs gemm
paths, vectorized bodies vs scalar tails). Everything here is built from

- elementwise IEEE operations that are correctly rounded (+, -, *, /, sqrt, floor, min/max,
  bit operations): each output element is one rounding of its own inputs, whatever the tensor's
  size, layout, vectorization or threading;
- reductions written as explicit sequences of those elementwise ops (a pairwise tree of slice
  additions, then a sequential loop over fixed-size blocks), so the order is in the code;
- rank-1 GEMM updates `acc += a_k (x) b_k` (an `addmm`/`baddbmm` with K = 1) on operands whose
  products are EXACT in FP32 (bf16 x bf16 or fp16 x fp16: at most 22 significant bits). A K = 1
  GEMM contains no reduction, and with an exact product every evaluation strategy (FMA or not,
  any blocking or thread split) rounds `acc + a * b` once to the same value.

Transcendentals are not taken from torch (`torch.exp` may evaluate vector bodies and scalar tails
with different code): `exp` and `log` below are range reduction plus polynomials in the ops
above (about 1-2 ulp; the tests measure it against float64).
"""

from __future__ import annotations

import torch

_LOG2E = 1.4426950408889634
_LN2_HI = 0.693359375  # few significant bits: n * _LN2_HI is exact for |n| < 2**9
_LN2_LO = -2.12194440e-4
_EXP_MAX = 88.72  # exp(88.72) < FLT_MAX
_EXP_MIN = -104.0  # exp(-104) rounds to 0 in FP32
_SQRT2 = 1.4142135623730951
EXACT_PRODUCT_DTYPES = (torch.bfloat16, torch.float16)


def _pow2(n: torch.Tensor) -> torch.Tensor:
    """2**n for integer-valued float n in [-126, 127], built from the exponent bits."""
    return ((n.to(torch.int32) + 127) << 23).view(torch.float32)


def exp(x: torch.Tensor) -> torch.Tensor:
    """FP32 exp: x = n ln2 + r (Cody-Waite), degree-7 Taylor on |r| <= ln2/2, times 2**n.
    exp(-inf) = 0, exp(+inf) = inf, NaN stays NaN."""
    x = x.to(torch.float32)
    xc = torch.clamp(x, _EXP_MIN, _EXP_MAX)
    n = torch.floor(xc * _LOG2E + 0.5)
    r = (xc - n * _LN2_HI) - n * _LN2_LO
    p = r * (1.0 / 5040.0) + (1.0 / 720.0)
    for c in (1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0):
        p = p * r + c
    n_hi = torch.clamp(n, -126.0, 127.0)
    y = (p * _pow2(n_hi)) * _pow2(n - n_hi)  # second factor is 1 unless the result is subnormal
    y = torch.where(x <= _EXP_MIN, torch.zeros_like(y), y)
    return torch.where(x > _EXP_MAX, torch.full_like(y, float("inf")), y)


def log(x: torch.Tensor) -> torch.Tensor:
    """FP32 natural log for x = 0, normal positive x or +inf: x = m 2**e with m in
    [sqrt(1/2), sqrt(2)), log m = 2 atanh((m-1)/(m+1)) by its odd series to s**11."""
    x = x.to(torch.float32)
    bits = x.view(torch.int32)
    e = ((bits >> 23) - 127).to(torch.float32)
    m = ((bits & 0x7FFFFF) | 0x3F800000).view(torch.float32)
    big = m > _SQRT2
    m = torch.where(big, m * 0.5, m)
    e = torch.where(big, e + 1.0, e)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    t = s2 * (1.0 / 11.0) + (1.0 / 9.0)
    for c in (1.0 / 7.0, 1.0 / 5.0, 1.0 / 3.0, 1.0):
        t = t * s2 + c
    y = e * _LN2_HI + ((2.0 * s) * t + e * _LN2_LO)
    y = torch.where(x == 0, torch.full_like(y, float("-inf")), y)
    return torch.where(x == float("inf"), x, y)


def tree_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim by a pairwise tree of slice additions (zero-padded to a power of
    two; adding +0 is exact). The tree depends only on the last dim's length."""
    n = x.shape[-1]
    width = 1 << max(n - 1, 0).bit_length()
    if width != n:
        x = torch.nn.functional.pad(x, (0, width - n))
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def block_sum(x: torch.Tensor, block: int) -> torch.Tensor:
    """Sum over the last dim in blocks of `block` from index 0: a tree inside each block, the
    block sums added sequentially. Trailing zeros (masked or padded entries) leave a nonzero sum
    unchanged, so the result depends only on the entries up to the last nonzero one."""
    n = x.shape[-1]
    num_blocks = max(-(-n // block), 1)
    if num_blocks * block != n:
        x = torch.nn.functional.pad(x, (0, num_blocks * block - n))
    partial = tree_sum(x.reshape(*x.shape[:-1], num_blocks, block))
    acc = partial[..., 0]
    for i in range(1, num_blocks):
        acc = acc + partial[..., i]
    return acc


def rank1_mm(a_MK: torch.Tensor, b_NK: torch.Tensor, *, chunk_m: int, chunk_n: int) -> torch.Tensor:
    """FP32 a @ b.T accumulated over k = 0, 1, ..., K-1 in order, one rounding per step.

    bf16/fp16 operands: rank-1 `addmm_` updates (exact products, see the module docstring).
    fp32 operands: product and sum as two separate elementwise ops (two roundings).
    Chunking over M and N only bounds memory; it cannot change any element's arithmetic.
    """
    m, k = a_MK.shape
    n = b_NK.shape[0]
    exact = a_MK.dtype in EXACT_PRODUCT_DTYPES and b_NK.dtype == a_MK.dtype
    a_KM = a_MK.to(torch.float32).t().contiguous()
    b_KN = b_NK.to(torch.float32).t().contiguous()
    out = torch.zeros((m, n), dtype=torch.float32, device=a_MK.device)
    for m0 in range(0, m, chunk_m):
        for n0 in range(0, n, chunk_n):
            acc = out[m0 : m0 + chunk_m, n0 : n0 + chunk_n]
            a_k, b_k = a_KM[:, m0 : m0 + chunk_m], b_KN[:, n0 : n0 + chunk_n]
            for kk in range(k):
                if exact:
                    acc.addmm_(a_k[kk, :, None], b_k[kk, None, :])
                else:
                    acc.add_(a_k[kk, :, None] * b_k[kk, None, :])
    return out


def rank1_bmm(a_BMK: torch.Tensor, b_BNK: torch.Tensor) -> torch.Tensor:
    """Batched FP32 a @ b^T over k in order via K = 1 `baddbmm_` updates; operands must have
    exact products (bf16/fp16 values, possibly stored as fp32)."""
    a = a_BMK.to(torch.float32)
    b_BKN = b_BNK.to(torch.float32).transpose(1, 2)
    acc = torch.zeros(
        (a.shape[0], a.shape[1], b_BKN.shape[2]), dtype=torch.float32, device=a.device
    )
    for kk in range(a.shape[2]):
        acc.baddbmm_(a[:, :, kk : kk + 1], b_BKN[:, kk : kk + 1, :])
    return acc
