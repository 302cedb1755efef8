"""The on-grid BF16 copy of a packed NVFP4 weight (`fp4_compile::ongrid_weight`'s kernel and its
launcher): out[r, k] = E2M1(code) * E4M3(block scale), exact, in one launch. The GEMMs read it as
their B operand (`gemm_kernel`, B on-grid); the decode is the one `gemm_kernel` does in registers
for packed B.

Shape legend: R rows (N out-features, flattened over experts), K in-features.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import arch_of, check_kernel_device, interpreting
from ..triton_helpers import e2m1_value, e4m3_value


@triton.jit
def _ongrid_kernel(
    codes_ptr, scales_ptr, out_ptr, R, K, BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr
):
    """out[r, k] = E2M1(code) * E4M3(scale of block k // 16), exact (rows flattened)."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    kb = tl.program_id(1).to(tl.int64) * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    ks = tl.program_id(1).to(tl.int64) * (BLOCK_K // 16) + tl.arange(0, BLOCK_K // 16)
    r64 = rows.to(tl.int64)[:, None]
    rmask = (rows < R)[:, None]
    byte = tl.load(
        codes_ptr + r64 * (K // 2) + kb[None, :], mask=rmask & (kb < K // 2)[None, :], other=0
    ).to(tl.int32)
    codes = tl.reshape(tl.join(byte & 15, byte >> 4), (BLOCK_R, BLOCK_K))
    sbyte = tl.load(
        scales_ptr + r64 * (K // 16) + ks[None, :], mask=rmask & (ks < K // 16)[None, :], other=0
    ).to(tl.int32)
    sval = e4m3_value(sbyte)
    s_full = tl.reshape(
        tl.broadcast_to(sval[:, :, None], (BLOCK_R, BLOCK_K // 16, 16)), (BLOCK_R, BLOCK_K)
    )
    cols = tl.program_id(1).to(tl.int64) * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(
        out_ptr + r64 * K + cols[None, :],
        (e2m1_value(codes) * s_full).to(out_ptr.dtype.element_ty),
        mask=rmask & (cols < K)[None, :],
    )


def ongrid_weight(codes: torch.Tensor, scale_bytes: torch.Tensor) -> torch.Tensor:
    """The on-grid BF16 copy of a quantized weight, [.., N, K] from codes [.., N, K/2] and E4M3
    scale bytes [.., N, K/16]: equal to `NVFP4Tensor.on_grid(torch.bfloat16)`, in one launch."""
    check_kernel_device(codes, "w_codes")
    k = codes.shape[-1] * 2
    if scale_bytes.shape[-1] * 16 != k or not (
        codes.is_contiguous() and scale_bytes.is_contiguous()
    ):
        raise ValueError(
            f"codes {tuple(codes.shape)} / scales {tuple(scale_bytes.shape)}: contiguous, K/2 and K/16"
        )
    r = codes.numel() // max(codes.shape[-1], 1)
    interp = interpreting()
    out = torch.empty(
        (*codes.shape[:-1], k),
        device=codes.device,
        dtype=torch.float32 if interp else torch.bfloat16,
    )
    if r and k:
        lc = pick_launch(arch_of(codes.device), "ongrid_weight")
        grid = (triton.cdiv(r, lc["block_r"]), triton.cdiv(k, lc["block_k"]))
        _ongrid_kernel[grid](
            codes,
            scale_bytes.view(torch.uint8),
            out,
            r,
            k,
            BLOCK_R=lc["block_r"],
            BLOCK_K=lc["block_k"],
            **warps_kwargs(lc),
        )
    return out.to(torch.bfloat16) if interp else out
