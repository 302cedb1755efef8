"""MoE weight gradient in NVFP4, all experts in one pass: dW_e = q(dY_e^T) @ q(X_e^T)^T.

Shape legend: T tokens sorted by expert, N out-features, K in-features, E experts, C the padded
token columns (every expert's segment padded with zero tokens to a multiple of 16, segments laid
end to end; C = T + 15 E rounded up to 16, a bound known without reading the offsets on the
host).

Bitwise equal to the per-expert loop `nvfp4_impl.cuda_wgrad(dY[s:t], X[s:t], recipe, seed + 1 + e)`
(the CPU reference's math), by construction:
- quantize: each 16-column block belongs to one segment, so the 1x16 blocks are the loop's
  blocks; the global scale of a segment is the amax over its own tokens (per tensor, or per row
  of dY_e^T); the stochastic-rounding stream of a segment is the one its own [N, width] matrix
  draws (`quantize_kernel.quantize_segments_ongrid`);
- GEMM: the program of (expert e, tile) walks e's segment in BLOCK_K chunks from the segment
  start, with the config the loop's dense launch picks for M = N: the same tiles, zeros where the
  loop's masked loads give zeros, the same MMA sequence (both take the pinned "nvfp4_wgrad"
  config), the same epilogue `(acc * gd_a) * gd_b`.
Launches: a handful of torch ops for the layout and the amaxes, 2 quantize kernels, 1 GEMM,
against 3 kernels and about 20 torch ops per expert for the loop (and no host read of offsets).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..format import BLOCK_SIZE
from ..sr_stream import sr_keys
from .configs import pick
from .runtime import arch_of, check_kernel_device, compile_options, interpreting


@triton.jit
def _grouped_wgrad_kernel(
    a_ptr, b_ptr, gda_ptr, gdb_ptr, out_ptr, start_ptr, width_ptr,
    N, K, stride_an, stride_bk, gda_e, gda_r, stride_oe, stride_on, tiles_per_program,
    DOT_F32: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SEGMENT_ALIGN: tl.constexpr,
):  # fmt: skip
    # One program: expert e, the BLOCK_M rows pid_m of dW_e, and `tiles_per_program` column
    # tiles of BLOCK_N, walked in ONE flat loop over (tile, K chunk): a segment is short (~256
    # tokens: 4 chunks), so a program per tile spends most of its time filling and draining the
    # load pipeline; the flat loop keeps it full across tiles (the next tile's first chunks
    # load while this tile's epilogue runs). Each output element is still one accumulator
    # walked over its segment in BLOCK_K chunks from the segment start: the bits do not depend
    # on tiles_per_program.
    # SEGMENT_ALIGN: every segment start is a multiple of it (16: widths are padded to 16).
    # Said to the compiler, it makes the loads along the token columns vector loads; without it
    # a start read from memory has unknown alignment and every element is its own load.
    pid_m = tl.program_id(0)
    e = tl.program_id(1)
    first = tl.program_id(2) * tiles_per_program
    start = tl.multiple_of(tl.load(start_ptr + e), SEGMENT_ALIGN)
    width = tl.load(width_ptr + e)
    k_steps = tl.maximum(tl.cdiv(width, BLOCK_K), 1)  # an empty segment stores zeros
    tiles = tl.minimum(tl.cdiv(K, BLOCK_N) - first, tiles_per_program)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = rows < N
    gda = tl.load(gda_ptr + e * gda_e + rows * gda_r, mask=rmask, other=1.0)
    gdb = tl.load(gdb_ptr + e)
    e64 = e.to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for it in range(0, tiles * k_steps):
        t = it // k_steps
        ki = it - t * k_steps
        cols = (first + t) * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < K
        kk = ki * BLOCK_K + tl.arange(0, BLOCK_K)
        kmask = kk < width
        a = tl.load(a_ptr + rows[:, None] * stride_an + (start + kk)[None, :],
                    mask=rmask[:, None] & kmask[None, :], other=0.0)  # fmt: skip
        b = tl.load(b_ptr + cols[None, :] * stride_bk + (start + kk)[:, None],
                    mask=cmask[None, :] & kmask[:, None], other=0.0)  # fmt: skip
        if DOT_F32:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
        if ki == k_steps - 1:
            out = ((acc * gda[:, None]) * gdb).to(out_ptr.dtype.element_ty)
            tl.store(out_ptr + e64 * stride_oe + rows[:, None] * stride_on + cols[None, :], out,
                     mask=rmask[:, None] & cmask[None, :])  # fmt: skip
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)


# Column tiles per program of the wgrad kernel: all of them up to this many (a program walks
# 8 x 4 chunks at the learner's gate_up shape instead of 4).
WGRAD_TILES_PER_PROGRAM = 8


def launch_wgrad_kernel(a, b, gd_a, gd_b, out, start, width, cfg, *,
                        tiles_per_program: int | None = None) -> None:  # fmt: skip
    """dW_e = (A_e @ B_e^T * gd_a[e]) * gd_b[e] into `out` [E, N, K]: A [N, C] and B [K, C] the
    on-grid operands (segment e at columns start[e] .. + width[e]), one launch for all
    experts with TileConfig `cfg`."""
    num_experts, n, k = out.shape
    if not (n and k and num_experts):
        return
    col_tiles = triton.cdiv(k, cfg.block_n)
    tpp = min(col_tiles, tiles_per_program or WGRAD_TILES_PER_PROGRAM)
    grid = (triton.cdiv(n, cfg.block_m), num_experts, triton.cdiv(col_tiles, tpp))
    dev = out.device
    _grouped_wgrad_kernel[grid](
        a, b, gd_a, gd_b, out, start, width,
        n, k, a.stride(0), b.stride(0), gd_a.stride(0), 1 if gd_a.dim() == 2 else 0,
        out.stride(0), out.stride(1), tpp,
        DOT_F32=interpreting() or dev.type != "cuda",
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        SEGMENT_ALIGN=BLOCK_SIZE, **cfg.launch_kwargs(), **compile_options(dev),
    )  # fmt: skip


def segment_layout(offsets: torch.Tensor, num_tokens: int) -> dict:
    """Device tensors of the padded layout: per column its token `src` [C] (-1: padding), per
    token its expert [T]; per expert `start`, `width` (int64 [E]); per 16-column block its
    expert `block_group` (int32)."""
    ends = offsets.to(torch.int64)
    counts = ends - torch.cat([ends.new_zeros(1), ends[:-1]])
    width = (counts + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
    pend = torch.cumsum(width, 0)
    start = pend - width
    num_experts = ends.shape[0]
    cols = -(-(num_tokens + (BLOCK_SIZE - 1) * num_experts) // BLOCK_SIZE) * BLOCK_SIZE
    tok = torch.arange(num_tokens, device=offsets.device)
    expert = torch.searchsorted(ends, tok, right=True)
    dest = start[expert] + tok - (ends - counts)[expert]
    blocks = torch.arange(0, cols, BLOCK_SIZE, device=offsets.device)
    group = torch.searchsorted(pend, blocks, right=True).clamp_(max=num_experts - 1)
    src = torch.full((cols,), -1, dtype=torch.int64, device=offsets.device)
    src[dest] = tok  # unique destinations: deterministic
    return {"src": src, "expert": expert, "start": start, "width": width, "cols": cols,
            "block_group": group.to(torch.int32)}  # fmt: skip


def _segment_amax(t_TD: torch.Tensor, layout: dict, num_experts: int, per_row: bool):
    """Per-expert amax of |t| over its tokens: [E] (per tensor) or [E, D] (per row of t^T)."""
    expert = layout["expert"]
    if per_row:
        a = t_TD.abs().to(torch.float32)  # max is exact in any dtype
        out = a.new_zeros((num_experts, t_TD.shape[1]))
        return out.scatter_reduce_(0, expert[:, None].expand_as(a), a, "amax")
    from .abs_max import segment_abs_max  # one read of t instead of abs + amax

    return segment_abs_max(t_TD, expert, num_experts)


def grouped_wgrad(
    dy_TN: torch.Tensor,
    x_TK: torch.Tensor,
    offsets: torch.Tensor,
    recipe,
    seed: int | torch.Tensor,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """dW [E, N, K] in `out_dtype` of the NVFP4 wgrad (recipe.wgrad == "nvfp4"), expert e
    drawing the stochastic-rounding seed `seed + 1 + e` (as `ops_nvfp4.nvfp4_grouped_mm_backward`).
    The kernel stores `out_dtype` directly: its FP32 epilogue, then one round-to-nearest-even
    cast, the bits of `.to(out_dtype)` of the FP32 result (in the interpreter, whose casts
    truncate, torch casts the FP32 result)."""
    check_kernel_device(dy_TN, "grad_out")
    from .quantize_kernel import quantize_segments_ongrid

    if recipe.wgrad != "nvfp4":
        raise ValueError(f"grouped_wgrad is the NVFP4 wgrad; recipe.wgrad={recipe.wgrad!r}")
    mode = recipe.grad.global_scale
    if mode not in ("per_tensor", "per_row"):
        raise ValueError(f"recipe.grad.global_scale={mode!r}: grouped wgrad needs a data amax")
    num_experts = offsets.shape[0]
    (t, n), k = dy_TN.shape, x_TK.shape[1]
    dev = dy_TN.device
    lay = segment_layout(offsets, t)
    keys = None
    if recipe.grad.rounding == "stochastic":  # seed: an int, or int64 [1] held on the device
        device_seed = isinstance(seed, torch.Tensor)
        if device_seed:
            from .sr_keys import device_sr_keys

            keys = device_sr_keys(seed, 1, num_experts)
        else:
            keys = sr_keys(seed + 1, num_experts, dev)
    seg = (lay["block_group"], lay["start"], lay["width"])
    a, gd_a = quantize_segments_ongrid(
        dy_TN, lay["src"], *seg, _segment_amax(dy_TN, lay, num_experts, mode == "per_row"),
        keys=keys,
    )  # fmt: skip
    b, gd_b = quantize_segments_ongrid(
        x_TK, lay["src"], *seg, _segment_amax(x_TK, lay, num_experts, False)
    )
    cfg = pick(arch_of(dev), "bf16" if dev.type == "cuda" else "fp32", "nvfp4_wgrad", n)
    interp = interpreting() or dev.type != "cuda"
    out = torch.empty((num_experts, n, k), dtype=torch.float32 if interp else out_dtype,
                      device=dev)  # fmt: skip
    launch_wgrad_kernel(a, b, gd_a, gd_b, out, lay["start"], lay["width"], cfg)
    return out.to(out_dtype)
