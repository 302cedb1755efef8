"""The NVFP4 quantizer on the GPU, read as its scale chain: ONE entry point, `quantize_triton`,
runs the steps of `fp4_compile.reference.quantize` (its docstring states every rounding) top to
bottom, one module per stage:

  1. amax           max |x| per tensor, row or expert          `abs_max_kernel.py`
  2. global scales  amax -> global decode and the block-scale  `global_scale_kernel.py`
                    multiplier (per row: 1 and 2 in ONE launch)
  3. block scales   vec_max x multiplier -> E4M3 (RNE)          `codes_kernel.py`
  4. codes          x x encode scale -> E2M1 (RNE or SR)        `codes_kernel.py` (3's launch)

A weight's 16x16 RNE quantize with a data amax runs 1-4 in one launch that reads it once
(`weight_quantize_kernel.py`, the same bits); a stochastic-rounding seed held on the device
(CUDA-graph replays) comes from `device_seed_kernel.py`. The device, its config key and launch
options are looked up once per call (`runtime.kernel_target`) and handed to every stage; the
tile is `configs.pick`'s. The transposed entry points (`quantize_segments_ongrid`,
`quantize_tokens_transposed_ongrid`: the wgrad's X^T operand, gathered and transposed by the
kernel) run steps 2-4 from the amaxes they are given. The launch plumbing sits below the chain.

Shape legend: R rows (leading dims flattened), K the last dim (a multiple of 16), E experts;
T tokens, D features, C columns of a transposed operand (tokens in 16-aligned segments).
"""

from __future__ import annotations

import torch

from ...format import BLOCK_SIZE, NVFP4Tensor
from ...reference import global_amax, validate_input
from ..configs import pick, pick_launch
from ..runtime import KernelTarget, kernel_target, output_buffer
from .abs_max_kernel import chunk_abs_max, row_abs_max
from .codes_kernel import launch_rows, launch_transposed
from .device_seed_kernel import seed_launch_args
from .global_scale_kernel import amax_global_stage, expert_global_stage, row_global_stage
from .row_codes_kernel import row_codes_from_parts
from .weight_quantize_kernel import quantize_weight_tiles


def quantize_triton(
    x: torch.Tensor,
    *,
    block: str = "1x16",
    global_scale: str | torch.Tensor = "per_row",
    rounding: str = "rne",
    seed: int | torch.Tensor | None = None,
    out: str = "packed",
    ongrid_dtype: torch.dtype = torch.bfloat16,
    name: str = "x",
    one_read_weights: bool = True,
    into: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None] | None = None,
):
    """Quantize with the Triton kernels. out="packed" -> NVFP4Tensor (bitwise == reference);
    out="ongrid" -> (on-grid values [..., K] in `ongrid_dtype`, global_decode); out="both" ->
    (NVFP4Tensor, on-grid values) from one read of x (a weight's packed form and on-grid copy).
    `seed` (stochastic rounding): an int, or a seed held on x's device (`sr_stream.DeviceSeed`,
    or an int64 [1] tensor: a CUDA-graph call's seed): the same stream either way.
    global_scale "per_expert" (x [E, N, K], 16x16) equals `reference.quantize_experts`; a static
    amax of shape [E, 1, 1] gives one static scale per expert.
    A dense weight's 16x16 RNE quantize with a per-tensor data amax (contiguous x) runs in one
    launch that reads x from HBM once (`weight_quantize_kernel.py`, the same bits); one_read_weights=
    False keeps the two-step form (the amax pass, then the codes kernel). Per-expert weights keep
    the two-step form unless `configs.LAUNCH`'s weight_quantize_experts names expert groups for
    the architecture (one launch was slower there: `weight_quantize_kernel.py`'s docstring).
    into = (codes, scale bytes as uint8, on-grid values): contiguous buffers of the result's
    shapes (None for what `out` does not ask for) that the kernels write instead of new tensors
    (a weight store's stable buffers: no copy after the quantize); the global decode is new."""
    target = _check_args(x, block, global_scale, rounding, seed, out, name)
    if one_read_weights and block == "16x16" and rounding == "rne":  # a weight: one read of x?
        groups = pick_launch(target.arch, "weight_quantize_experts")["expert_groups"]
        if _one_read(x, global_scale, groups):
            return quantize_weight_tiles(
                x,
                global_scale,
                out=out,
                ongrid_dtype=ongrid_dtype,
                expert_groups=max(groups, 1),
                target=target,
                into=into,
            )
    shape, k = tuple(x.shape), x.shape[-1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        raise ValueError(f"{name} must have a unit stride along its last dim")
    if _few_rows_per_row_ongrid(x2, global_scale, rounding, out, into, target):
        # steps 1-4 over (row blocks, column chunks), so that batch 1 is not one program: the
        # rows' maxima in parts, then `row_codes` folds them (max: exact in any order) and
        # quantizes as steps 2-4 below do, the same bits
        parts = chunk_abs_max(x2, target=target)
        ongrid, gd_rows, _ = row_codes_from_parts(
            x2, parts, target=target, ongrid_dtype=ongrid_dtype
        )
        return ongrid.reshape(shape), gd_rows.reshape(*shape[:-1], 1)
    # steps 1-2: the global decode (as the NVFP4Tensor holds it) and, per row of x2 (or one for
    # all), the global decode and the multiplier the codes kernel reads
    gd, gd_rows, mult_rows = _global_scales(x, x2, global_scale, target)
    # steps 3-4: E4M3 block scales and E2M1 codes, one launch
    seed_args = seed_launch_args(seed, target.device) if rounding == "stochastic" else None
    codes, scales, ongrid = _outputs(x2, out, ongrid_dtype, into)
    cfg = pick(target.arch, "any", "nvfp4_quantize", x2.shape[0])
    launch_rows(
        x2,
        gd_rows,
        mult_rows,
        codes,
        scales,
        ongrid,
        per_row=gd.dim() > 0,
        tile16=block == "16x16",
        seed_args=seed_args,
        out=out,
        cfg=cfg,
        target=target,
    )
    if out == "ongrid":
        return ongrid.reshape(shape), gd
    q = NVFP4Tensor(
        codes=codes.reshape(*shape[:-1], k // 2),
        block_scales=scales.view(torch.float8_e4m3fn).reshape(*shape[:-1], k // BLOCK_SIZE),
        global_decode=gd.contiguous(),
        shape=shape,
        block=block,
    )
    return (q, ongrid.reshape(shape)) if out == "both" else q


def global_stage(
    x: torch.Tensor, global_scale: str | torch.Tensor, *, target: KernelTarget | None = None
):
    """Steps 1-2 of `reference.quantize`, bitwise: -> (global_decode, multiplier), each [] or
    [..., R, 1] (or [E, 1, 1] for "per_expert" / a static amax of shape [E, 1, 1]). The amax in
    one read of x (`abs_max_kernel`), the scales in one launch (`amax_global_stage`)."""
    target = target or kernel_target(x)
    if isinstance(global_scale, torch.Tensor):
        amax = global_scale.reshape(()) if global_scale.dim() == 0 else global_scale
    elif global_scale == "per_expert":  # [E, N, K] -> one amax per expert, [E, 1, 1]
        # one read of the weight (row maxima), then the max over each expert's rows: bitwise
        # `x.abs().amax(dim=(-2, -1))`, without the full-size |x| (abs_max's docstring)
        e, n, k = x.shape
        if x.numel():
            amax = row_abs_max(x.reshape(e * n, k), target=target)
            amax = amax.reshape(e, n).amax(dim=-1).reshape(e, 1, 1)
        else:  # empty: torch's own error for an empty reduction
            amax = x.abs().amax(dim=(-2, -1), keepdim=True).to(torch.float32)
    elif global_scale == "per_tensor" and x.numel():
        # two launches instead of about ten: max |x| per row in one read of x, then the per-row
        # global stage over those maxima as ONE row (its max is the tensor's amax; the same
        # enc / gd / mult roundings as below), bitwise the torch ops of this function
        rows = row_abs_max(
            x.reshape(-1, x.shape[-1]) if x.dim() > 1 else x.reshape(1, -1), target=target
        )
        gd, mult = row_global_stage(rows.reshape(1, -1), target=target)
        return gd.reshape(()), mult.reshape(())
    else:
        amax = global_amax(x, global_scale)
    # steps 2-4 of the reference's global stage in one launch (no host->device copy)
    return amax_global_stage(amax.to(torch.float32), target=target)


def quantize_segments_ongrid(
    x_TD: torch.Tensor,
    src: torch.Tensor,
    block_group: torch.Tensor,
    seg_start: torch.Tensor,
    seg_width: torch.Tensor,
    amax: torch.Tensor,
    *,
    seed=None,
    ongrid_dtype: torch.dtype = torch.bfloat16,
):
    """1x16 quantize of the padded transpose X [D, C] of x [T, D]: column c of X is token
    src[c] of x, or zeros where src[c] < 0 (int64 [C], C % 16 == 0). The columns are G segments
    laid end to end (16-aligned), each quantized as its own [D, width_g] matrix: equal, bitwise,
    to `quantize_triton(X[:, seg_g], out="ongrid")` per segment. block_group int32 [C/16] (the
    segment of each 16-column block), seg_start / seg_width int64 [G], amax FP32 [G] (per
    tensor) or [G, D] (per row of X); seed None (RNE) or the seed of segment 0 (stochastic
    rounding: segment g draws the stream of seed + g; an int or a device seed). -> (on-grid [D, C], global decode [G] or [G, D])."""
    target = kernel_target(x_TD, "x")
    if x_TD.dim() != 2 or src.dim() != 1 or src.shape[0] % BLOCK_SIZE:
        raise ValueError(
            f"x must be [T, D] and src [C] with C % 16 == 0: {x_TD.shape}, {src.shape}"
        )
    layout = (src, block_group, seg_start, seg_width)
    return _transposed(x_TD, amax, src.shape[0], seed, layout, ongrid_dtype, target)


def quantize_tokens_transposed_ongrid(
    x_TD: torch.Tensor,
    amax: torch.Tensor,
    *,
    seed=None,
    ongrid_dtype: torch.dtype = torch.bfloat16,
):
    """`quantize_segments_ongrid` of ONE segment of all tokens (X = x^T zero-padded to a
    multiple of 16 columns), without layout tensors: the kernel derives column c's token (c,
    or padding from T on). amax FP32 [1] or [1, D]; seed: None (RNE), an int or a device seed
    (`sr_stream.DeviceSeed`, or an int64 [1] tensor). Bitwise the segmented call with src =
    [0..T) + [-1] * pad, one group, start 0, width C (and the same seed)."""
    target = kernel_target(x_TD, "x")
    if x_TD.dim() != 2:
        raise ValueError(f"x must be [T, D], got {tuple(x_TD.shape)}")
    cols = -(-x_TD.shape[0] // BLOCK_SIZE) * BLOCK_SIZE
    return _transposed(x_TD, amax, cols, seed, None, ongrid_dtype, target)


# --------------------------------------------------------------------------- launch plumbing
def _check_args(x, block, global_scale, rounding, seed, out, name) -> KernelTarget:
    validate_input(x, block, name)
    target = kernel_target(x, name)
    if out not in ("packed", "ongrid", "both"):
        raise ValueError(f"out must be 'packed', 'ongrid' or 'both', got {out!r}")
    if isinstance(global_scale, str) and global_scale == "per_expert" and x.dim() != 3:
        raise ValueError(f"global_scale='per_expert' needs {name} of shape [E, N, K]")
    if isinstance(global_scale, str) and global_scale == "per_row" and block == "16x16":
        raise ValueError("global_scale='per_row' with block='16x16' is not allowed (W vs W^T)")
    if rounding not in ("rne", "stochastic"):
        raise ValueError(f"rounding must be 'rne' or 'stochastic', got {rounding!r}")
    if rounding == "stochastic" and seed is None:
        raise ValueError("rounding='stochastic' needs an integer seed")
    return target


def _one_read(x, global_scale, groups) -> bool:
    """Whether `weight_quantize_kernel` takes a 16x16 RNE quantize: a contiguous, non-empty
    weight with a per-tensor data amax (or per expert, where expert groups are set)."""
    data_amax = isinstance(global_scale, str) and (
        global_scale == "per_tensor" or (global_scale == "per_expert" and groups > 0)
    )
    return data_amax and x.numel() > 0 and x.is_contiguous()


def _few_rows_per_row_ongrid(x2, global_scale, rounding, out, into, target) -> bool:
    """Whether a 1x16 per-row RNE on-grid quantize takes the split form: non-empty, fewer rows
    than `configs.LAUNCH`'s row_quantize split_rows_below, into no given buffer."""
    per_row = isinstance(global_scale, str) and global_scale == "per_row"
    if not (per_row and rounding == "rne" and out == "ongrid" and into is None and x2.numel()):
        return False
    return x2.shape[0] < pick_launch(target.arch, "row_quantize")["split_rows_below"]


def _global_scales(x, x2, global_scale, target):
    """Steps 1-2 -> (global decode as the NVFP4Tensor holds it, global decode and multiplier
    per row of x2 [R] or one for all [1])."""
    shape = tuple(x.shape)
    if isinstance(global_scale, str) and global_scale == "per_row":
        gd_rows, mult_rows = row_global_stage(x2, target=target)  # 1 and 2: one launch
        return gd_rows.reshape(*shape[:-1], 1), gd_rows, mult_rows
    if isinstance(global_scale, str) and global_scale == "per_expert" and x2.shape[0]:
        # the row maxima, then each expert's scales already repeated per row: two launches
        rows = row_abs_max(x2, target=target)
        gd_e, _, gd_rows, mult_rows = expert_global_stage(rows, shape[0], target=target)
        return gd_e.reshape(shape[0], 1, 1), gd_rows, mult_rows
    gd, mult = global_stage(x, global_scale, target=target)
    if gd.dim() == 3:  # static [E, 1, 1]: one value per row of [E*N, K]
        return gd, gd.expand(*shape[:-1], 1).reshape(-1), mult.expand(*shape[:-1], 1).reshape(-1)
    return gd, gd.reshape(-1), mult.reshape(-1)


def _outputs(x2, out, ongrid_dtype, into=None):
    """(codes, scale bytes, on-grid values) buffers of x2's quantize (new, or `into`'s); the
    ones `out` does not ask for alias one that it does (the kernel does not write them)."""
    r, k = x2.shape
    dev = x2.device
    into_codes, into_scales, into_ongrid = into or (None, None, None)
    if out == "ongrid":
        ongrid = output_buffer(into_ongrid, (r, k), ongrid_dtype, dev)
        return ongrid, ongrid, ongrid
    codes = output_buffer(into_codes, (r, k // 2), torch.uint8, dev)
    scales = output_buffer(into_scales, (r, k // BLOCK_SIZE), torch.uint8, dev)
    both = out == "both"
    ongrid = output_buffer(into_ongrid, (r, k), ongrid_dtype, dev) if both else codes
    return codes, scales, ongrid


def _transposed(x_TD, amax, c, seed, layout, ongrid_dtype, target):
    r = x_TD.shape[1]
    if amax.dim() not in (1, 2) or (amax.dim() == 2 and amax.shape[1] != r):
        raise ValueError(f"amax must be [G] or [G, D={r}], got {tuple(amax.shape)}")
    gd, mult = global_stage(x_TD, amax.to(torch.float32), target=target)  # step 2
    gd, mult = gd.contiguous(), mult.contiguous()
    ongrid = torch.empty((r, c), dtype=ongrid_dtype, device=x_TD.device)
    seed_args = None if seed is None else seed_launch_args(seed, target.device)
    cfg = pick(target.arch, "any", "nvfp4_quantize_segments", r)
    launch_transposed(
        x_TD,
        gd,
        mult,
        ongrid,
        per_row=amax.dim() == 2,
        layout=layout,
        seed_args=seed_args,
        cfg=cfg,
        target=target,
    )  # steps 3-4
    return ongrid, gd


__all__ = [
    "quantize_triton",
    "quantize_segments_ongrid",
    "quantize_tokens_transposed_ongrid",
    "global_stage",
]
