"""The weights' NVFP4 quantize (16x16 tiles, RNE, the global scale of each expert's amax or of
the whole tensor's) in ONE persistent launch that reads each weight from HBM once.

The two-step form (`quantize_kernel.global_stage`, then `codes_kernel`) reads every weight
twice per learner step: once for the amaxes, once to quantize. On the H200 learner the amax
read alone was 0.64 ms (2.4 GB of expert weights, `docs/learner_performance.md`). Here program
p of P (all P resident at once) walks the tiles p, p + P, ... of expert e twice:

1. amax: the max of the sign-cleared bits of x as integers (non-negative floats order like
   their bits, so this IS max |x|, exact; a NaN's bits lie above inf's, so a NaN makes the
   amax NaN, as torch's amax does), merged into amax[e] with an atomic max; then the program
   announces it on expert e's counter.
2. quantize: once all P programs have announced, every program reads amax[e], derives the
   global scales (`global_scale_kernel.scales_from_amax`, one IEEE rounding per step) and
   quantizes its tiles with the block-scale and rounding helpers of `_quantize_kernel`
   (`weight_quantize_tiles.py` holds both steps).

Each program takes the amax of expert e + 1 BEFORE it waits for expert e, so it rarely waits,
and its second read of expert e finds the tiles in L2 (one expert of the 30B-A3B shapes is
<= 6.3 MB; the H200's L2 is 50 MB). A dense weight is one "expert" (per-tensor amax).

Faster than the two-step form for a dense weight, slower for many experts, where a grid-wide
wait per expert (every program announces on one counter, then every program polls it) costs
more than one expert's traffic (H200, the same bits in every row:
benchmarks/results/2026-12-05_tune_kernels_weights_20848a7.md, the 20b0dc2 run). `expert_groups` G
splits the programs into G groups that walk the experts G apart, each waiting on its own
programs only: E/G waits per program among P/G programs, G experts in L2 at once.
`quantize_triton` routes per-expert weights here only where `configs.LAUNCH`'s
weight_quantize_experts names a G for the architecture (0: the two-step form).

Bitwise `codes_kernel` after `global_stage` (tests/codegen/nvfp4/test_weight_quantize.py). The
wait needs every program resident at once: P = SMs x min(programs per SM, what fits on one
SM), the fit computed from the compiled kernel's registers, shared memory and threads (the
CUDA occupancy rules; one fewer than the estimate, and never below 1: one program per SM
always fits). The interpreter runs programs one after the other, so a wait would never end:
there the same kernel runs as two launches (all the amaxes, then all the quantizes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...format import BLOCK_SIZE, NVFP4Tensor
from ..configs import pick, pick_launch
from ..runtime import KernelTarget, interpreting, kernel_target, output_buffer
from ..triton_helpers import ONE_SIXTH_F32
from .weight_quantize_tiles import announce_amax, quantize_expert

_PHASE_AMAX, _PHASE_QUANTIZE, _PHASE_BOTH = 0, 1, 2


@triton.jit(do_not_specialize=["E", "N"])
def _weight_quantize_kernel(
    x_ptr,
    bits_ptr,
    state_ptr,
    gd_ptr,
    codes_ptr,
    scales_ptr,
    ongrid_ptr,
    E,
    N,
    K,
    one_sixth,
    ABS_MASK: tl.constexpr,
    BITS16: tl.constexpr,
    PHASE: tl.constexpr,
    ONGRID: tl.constexpr,
    PACKED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUPS: tl.constexpr = 1,
):
    # state_ptr: int32 [2E], zeros: the amax bits of each expert, then its announcement count.
    # PHASE 0: the amaxes only; 1: the quantizes only (a later launch); 2: both, in one launch.
    # GROUPS: the programs split into GROUPS groups (program p in group p % GROUPS); group g
    # walks the experts g, g + GROUPS, ... and waits only on its own programs (GROUPS experts
    # in flight at once, in L2 together: waits per program E / GROUPS instead of E).
    group = tl.program_id(0).to(tl.int64) % GROUPS
    pid = tl.program_id(0).to(tl.int64) // GROUPS  # the program's index in its group
    P = (tl.num_programs(0) - group + GROUPS - 1) // GROUPS  # the group's programs
    if PHASE != 1 and group < E:
        announce_amax(bits_ptr, state_ptr, group, E, pid, P, N, K, ABS_MASK, BLOCK_M, BLOCK_K)
    for e in range(group, E, GROUPS):
        if PHASE != 1:
            if e + GROUPS < E:  # the group's next expert's amax before this one's wait
                announce_amax(
                    bits_ptr, state_ptr, e + GROUPS, E, pid, P, N, K, ABS_MASK, BLOCK_M, BLOCK_K
                )
        if PHASE != 0:
            if PHASE == 2:
                seen = tl.atomic_add(state_ptr + E + e, 0)
                while seen < P:
                    seen = tl.atomic_add(state_ptr + E + e, 0)
            amax_bits = tl.atomic_max(state_ptr + e, 0)  # a coherent read (every max is >= 0)
            quantize_expert(
                x_ptr,
                gd_ptr,
                codes_ptr,
                scales_ptr,
                ongrid_ptr,
                amax_bits,
                e,
                pid,
                P,
                N,
                K,
                one_sixth,
                BITS16,
                ONGRID,
                PACKED,
                BLOCK_M,
                BLOCK_K,
            )


_RESIDENT: dict = {}


def _resident_per_sm(args, flags, props) -> int:
    """How many programs of the compiled kernel surely fit on one SM at once: the CUDA
    occupancy limits (registers in 256-register warp units, shared memory with its 1 KiB per
    block, threads, 32 blocks) of the compiled binary, minus one for safety, at least 1."""
    key = (props.name, args[0].dtype, args[6].dtype, args[-2], tuple(sorted(flags.items())))
    if key not in _RESIDENT:
        kernel = _weight_quantize_kernel.warmup(*args, grid=(1,), PHASE=_PHASE_BOTH, **flags)
        kernel._init_handles()  # loads the binary: its register count
        warps = flags["num_warps"]
        per_warp = -(-kernel.n_regs * 32 // 256) * 256
        by_regs = getattr(props, "regs_per_multiprocessor", 65536) // max(per_warp, 1) // warps
        smem = getattr(props, "shared_memory_per_multiprocessor", 233472)
        by_smem = smem // (kernel.metadata.shared + 1024)
        by_threads = getattr(props, "max_threads_per_multi_processor", 2048) // (32 * warps)
        _RESIDENT[key] = max(1, min(by_regs, by_smem, by_threads, 32) - 1)
    return _RESIDENT[key]


def quantize_weight_tiles(
    x: torch.Tensor,
    global_scale: str,
    *,
    out: str = "packed",
    ongrid_dtype: torch.dtype = torch.bfloat16,
    programs_per_sm: int | None = None,
    expert_groups: int = 1,
    target: KernelTarget | None = None,
    into: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None] | None = None,
):
    """16x16 RNE quantize of x with a data amax per expert (x [E, N, K], global_scale
    "per_expert") or per tensor (x [..., N, K], "per_tensor"), in one read of x. Returns what
    `quantize_kernel.quantize_triton` returns for the same arguments, bitwise: an NVFP4Tensor
    (out="packed"), (on-grid values, global decode) ("ongrid") or (NVFP4Tensor, on-grid)
    ("both"). x must be contiguous and non-empty. expert_groups (per expert): the programs walk
    the experts in that many groups, each waiting on its own programs only (the same bits for
    any value; speed only). programs_per_sm: at most this many programs per SM (default:
    `configs.LAUNCH`'s "weight_quantize" row; fewer where fewer fit). target: the caller's
    `runtime.kernel_target` of x (looked up here without one). into: `quantize_triton`'s
    (the buffers written instead of new ones)."""
    if not isinstance(expert_groups, int) or expert_groups < 1:
        raise ValueError(f"expert_groups must be an int >= 1, got {expert_groups!r}")
    target = target or kernel_target(x, "x")
    if global_scale not in ("per_expert", "per_tensor"):
        raise ValueError(f"global_scale must be 'per_expert' or 'per_tensor', got {global_scale!r}")
    if out not in ("packed", "ongrid", "both"):
        raise ValueError(f"out must be 'packed', 'ongrid' or 'both', got {out!r}")
    if x.dim() < 2 or x.shape[-1] % BLOCK_SIZE or x.shape[-2] % BLOCK_SIZE or not x.numel():
        raise ValueError(
            f"x must be non-empty [..., N, K] with N, K multiples of 16, got {tuple(x.shape)}"
        )
    if global_scale == "per_expert" and x.dim() != 3:
        raise ValueError(
            f"global_scale='per_expert' needs x of shape [E, N, K], got {tuple(x.shape)}"
        )
    if not x.is_contiguous():
        raise ValueError("x must be contiguous (a weight's own storage)")
    bits_dtype = {
        torch.bfloat16: torch.int16,
        torch.float16: torch.int16,
        torch.float32: torch.int32,
    }
    if x.dtype not in bits_dtype:
        raise TypeError(f"x must be float32, bfloat16 or float16, got {x.dtype}")
    shape = tuple(x.shape)
    k = shape[-1]
    e = shape[0] if global_scale == "per_expert" else 1
    n = x.numel() // (e * k)
    dev = x.device
    state = torch.zeros(2 * e, dtype=torch.int32, device=dev)
    gd = torch.empty(e, dtype=torch.float32, device=dev)
    packed = out in ("packed", "both")
    ongrid_wanted = out in ("ongrid", "both")
    into_codes, into_scales, into_ongrid = into or (None, None, None)
    if packed:
        codes = output_buffer(into_codes, (e * n, k // 2), torch.uint8, dev)
        scales = output_buffer(into_scales, (e * n, k // BLOCK_SIZE), torch.uint8, dev)
    else:
        codes = scales = torch.empty((0,), dtype=torch.uint8, device=dev)
    ongrid = (
        output_buffer(into_ongrid, (e * n, k), ongrid_dtype, dev)
        if ongrid_wanted
        else torch.empty((0,), dtype=ongrid_dtype, device=dev)
    )
    arch = target.arch
    cfg = pick(arch, "any", "nvfp4_weight_quantize", n)
    two_launches = interpreting() or dev.type != "cuda"  # programs run one after the other
    lc = pick_launch("interpreter" if two_launches else arch, "weight_quantize")
    bits16 = x.element_size() == 2
    args = (
        x,
        x.view(bits_dtype[x.dtype]),
        state,
        gd,
        codes,
        scales,
        ongrid,
        e,
        n,
        k,
        ONE_SIXTH_F32,
    )
    flags = dict(
        ABS_MASK=0x7FFF if bits16 else 0x7FFFFFFF,
        BITS16=bits16,
        ONGRID=ongrid_wanted,
        PACKED=packed,
        BLOCK_M=cfg.block_m,
        BLOCK_K=cfg.block_k,
        GROUPS=expert_groups if global_scale == "per_expert" else 1,
        **cfg.launch_kwargs(),
        **target.options,
    )
    if two_launches:
        grid = (max(lc["programs"], flags["GROUPS"]),)
        _weight_quantize_kernel[grid](*args, PHASE=_PHASE_AMAX, **flags)
        _weight_quantize_kernel[grid](*args, PHASE=_PHASE_QUANTIZE, **flags)
    else:
        props = torch.cuda.get_device_properties(dev)
        most = lc["programs_per_sm"] if programs_per_sm is None else programs_per_sm
        per_sm = min(most, _resident_per_sm(args, flags, props))
        programs = props.multi_processor_count * per_sm
        if programs < flags["GROUPS"]:
            raise ValueError(f"expert_groups={expert_groups} exceeds the {programs} programs")
        _weight_quantize_kernel[(programs,)](*args, PHASE=_PHASE_BOTH, **flags)
    gd = gd.reshape(e, 1, 1) if global_scale == "per_expert" else gd.reshape(())
    ongrid = ongrid.reshape(shape) if ongrid_wanted else None
    if out == "ongrid":
        return ongrid, gd
    q = NVFP4Tensor(
        codes=codes.reshape(*shape[:-1], k // 2),
        block_scales=scales.view(torch.float8_e4m3fn).reshape(*shape[:-1], k // BLOCK_SIZE),
        global_decode=gd,
        shape=shape,
        block="16x16",
    )
    return (q, ongrid) if out == "both" else q
