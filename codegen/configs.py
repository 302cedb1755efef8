"""Pinned Triton tile configs, keyed by (architecture, operand dtype, op). No runtime autotuning.

Why the bits do not depend on the batch (M), the contract the learner/rollout alignment rests on:

1. Every output element is ONE program's FP32 accumulator, walked over K in a fixed order:
   `for k in range(0, K, BLOCK_K): acc = tl.dot(a_tile, b_tile, acc)`. No split-K, no
   stream-K, no atomics: the reduction order of element (m, n) is k = 0, 1, ..., K-1 in
   BLOCK_K chunks, whatever M is.
2. BLOCK_K is the same for every config of an op (asserted below), so the chunking of K never
   follows M. Configs may change BLOCK_M / BLOCK_N / warps / stages with M (for speed).
3. Changing BLOCK_M can change the MMA instruction on sm_90: mma.sync below 64 rows, wgmma at
   64 and above. The two do NOT round alike: on the H200 a grouped call whose M bucket was 16
   (mma.sync) and the per-expert call at 64 (wgmma) differed in 5 of 1088 outputs on
   cancellation-heavy data (tests/codegen/nvfp4/test_nvfp4_kernels.py on CUDA), although
   random-normal data at N = K = 8192 shows identical bits. So every sm_90 bucket has
   BLOCK_M >= 64 (asserted below): one instruction family (wgmma m64nNk16) for every M.
   BLOCK_N and the warp count may still follow M (and, for a dense GEMM, its output width N:
   `NARROW_N`, a static weight shape); that, too, is measured, not guaranteed:
   the CUDA run of tests/codegen (cancellation-heavy rows across every bucket) and
   `benchmarks/nvfp4_gpu_check.py` re-check THESE configs and record the result.
4. Rows never interact: masked rows load zeros, and the epilogue is per element.

5. The GEMM tables ("nvfp4_gemm" for packed B, "nvfp4_gemm_ongrid" for on-grid B,
   "nvfp4_wgrad") share BLOCK_K (asserted below): packed and on-grid weights give the same bits,
   so the learner (on-grid from 256 rows per weight, `gemm.ONGRID_FORWARD_MIN_ROWS`) and
   the rollout's decode (packed) agree.

What was verified where: on CPU, the interpreter configs (one per op) are checked for batch
invariance by tests/codegen; on the H200 the sm_90 buckets are checked by the GPU script.
The offline tuner `python -m benchmarks.tune_kernels` times candidates on the learner's shapes
and counts the bytes each changes against the pinned config; a winner is copied here by hand.
Every launch constant lives here, in two kinds of table, each read by its function only: tiles
bucketed by M (`PINNED`, keyed by (architecture, dtype, op), with its `NARROW_N` override, read by
`pick`; the decode GEMM's `DECODE`, keyed by architecture, read by `pick_decode`), and `LAUNCH`,
the other kernels' launch constants keyed by (architecture, op), read by `pick_launch`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TileConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3

    def launch_kwargs(self) -> dict:
        return {"num_warps": self.num_warps, "num_stages": self.num_stages}


# (max_m inclusive or None for "any larger", config). Buckets are chosen from M, a static shape.
_GEMM_SM90 = (
    (64, TileConfig(64, 64, 64, num_warps=4, num_stages=4)),
    (None, TileConfig(128, 128, 64, num_warps=8, num_stages=3)),
)
_GEMM_INTERPRETER = ((None, TileConfig(16, 32, 32, num_warps=1, num_stages=1)),)
# B on-grid BF16 (no in-register dequantize): at M > 64 a wide N tile in a 4-stage pipeline
# (192 KiB of shared memory), the fastest at the learner's shapes on the H200 with 0 bytes
# differing (benchmarks/results/2026-12-04_tune_kernels_deep_865d6a7.md).
_GEMM_ONGRID_SM90 = (
    (64, TileConfig(64, 64, 64, num_warps=4, num_stages=4)),
    (None, TileConfig(128, 256, 64, num_warps=8, num_stages=4)),
)
# Weight gradients (learner only; the dense wgrad and the one-pass MoE wgrad share it, so the
# MoE wgrad equals the per-expert loop by construction). A weight of <= 512 rows (the k / v
# projections, 4 KV heads x 128) would give the 128x256 tile 32 programs on 132 SMs: 64x128
# there (H200, 0 bytes differ: benchmarks/results/2026-12-04_tune_kernels_dense_6fdd573.md).
_WGRAD_SM90 = (
    (512, TileConfig(64, 128, 64, num_warps=8, num_stages=4)),
    (None, TileConfig(128, 256, 64, num_warps=8, num_stages=3)),
)

# Narrow outputs (N <= max_n) of a dense, non-grouped GEMM, in place of the table's catch-all
# bucket (M > 64): the 128x256 tile gives the k / v projections' forward (N = 512) 64 programs
# at 4096 tokens. The config follows N, a weight's static shape, never the batch (H200, 0 bytes
# differ, the same file as the wgrad's above); their dgrad (N = 2048) and the q / o GEMMs stay
# at the tables' tiles.
NARROW_N: dict[tuple[str, str, str], tuple[int, TileConfig]] = {
    ("sm_90", "bf16", "nvfp4_gemm_ongrid"): (
        512,
        TileConfig(128, 128, 64, num_warps=8, num_stages=3),
    ),
}

# Quantize: BLOCK_M rows x BLOCK_K columns per program (BLOCK_M a multiple of 16 for 16x16 tiles).
# The fastest tiling at the learner's shapes on the H200, 0 bytes differ (every tiling within
# 10%: the kernel is ALU-bound; benchmarks/results/2026-12-04_tune_kernels_f330937.md).
_QUANT_SM90 = ((None, TileConfig(16, 0, 128, num_warps=2, num_stages=1)),)
_QUANT_INTERPRETER = ((None, TileConfig(16, 0, 64, num_warps=1, num_stages=1)),)
# The transposing (segmented) quantize of the wgrad operands, pinned apart: its strided token
# loads want more programs in flight (H200, learner shapes, 0 bytes differ:
# benchmarks/results/2026-12-04_tune_kernels_2c9e3e9.md).
_QUANT_SEGMENTS_SM90 = ((None, TileConfig(16, 0, 128, num_warps=2, num_stages=1)),)

# The weights' one-launch quantize (`nvfp4/weight_quantize_kernel.py`): 4 warps, so that its
# persistent grid (2 programs per SM) is resident whatever the register count; 32 x 128 elements
# per tile keeps 32 per thread, as the tiling above.
_WEIGHT_QUANT_SM90 = ((None, TileConfig(32, 0, 128, num_warps=4, num_stages=1)),)


@dataclass(frozen=True)
class DecodeConfig:
    """A tile of the few-row packed GEMM (`nvfp4/decode_gemm_kernel.py`): BLOCK_T tokens x
    BLOCK_W weight rows (the MMA's left operand: >= 64 on sm_90, so wgmma as in the learner),
    BLOCK_K along K, warps and software-pipeline stages; speed only, the same values. (The E2M1
    placement is the kernel's word form, the fewest instructions per weight of the forms swept:
    `benchmarks.decode_sass_audit`, `2026-12-05_decode_gemm_43f05e0.md`.) `weights_right`: the
    learner's orientation (tokens the MMA's left operand, so BLOCK_T >= 64 on sm_90 as for the
    learner's tiles; the decoded weights its right operand, through shared memory, no register
    layout conversion) instead of the swapped one."""

    block_t: int
    block_w: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4
    weights_right: bool = False

    def launch_kwargs(self) -> dict:
        return {"num_warps": self.num_warps, "num_stages": self.num_stages}


# (max rows per weight inclusive, config). The packed forward GEMM of a weight seeing at most the
# last bucket's rows (per expert for MoE) runs the decode kernel on these architectures; beyond,
# the tables above. Bits: the same as the learner's GEMM (the kernel's docstring proves it; on
# the H200 every config of the sweep gave the learner's bits, tests/gpu/test_gpu_decode_gemm.py
# re-checks the pinned ones). Each bucket is the sweep's fastest on the grouped (MoE) decode
# shapes, within 7% of its fastest dense 8192^2 (CUDA-graph timing, H200:
# benchmarks/results/2026-12-05_decode_gemm_20848a7.md; BLOCK_K 512 is 6% faster on the dense
# shape at <= 16 rows and 30% slower grouped).
DECODE = {
    "sm_90": (
        (16, DecodeConfig(16, 64, 128, num_warps=4, num_stages=4)),
        (64, DecodeConfig(64, 64, 128, num_warps=4, num_stages=3)),
    ),
    "interpreter": ((64, DecodeConfig(16, 32, 32, num_warps=1, num_stages=1)),),
}
# Where `launch_gemm` sends few-row packed GEMMs to the decode kernel. Not the interpreter: its
# FP32 `tl.dot` is numpy's, whose summation order follows the operand layout, so there the
# decode kernel is tested directly (tests/codegen/nvfp4/test_decode_gemm.py), not dispatched.
DECODE_DISPATCH = ("sm_90",)


def check_decode_config(arch: str, cfg: DecodeConfig) -> None:
    """A ValueError where `cfg` could not give the learner's bits on `arch`: on sm_90 the MMA's
    left operand (weights, or tokens with `weights_right`) needs >= 64 rows, so that it issues
    wgmma as the learner's GEMM does (16-row tiles issue mma.sync, which rounds differently)."""
    if cfg.block_k % 32 or cfg.block_t < 16:
        raise ValueError(f"{cfg}: block_k must be a multiple of 32 and block_t >= 16")
    left_rows = cfg.block_t if cfg.weights_right else cfg.block_w
    if arch.startswith("sm_9") and left_rows < 64:
        raise ValueError(
            f"{cfg}: on {arch} the MMA's left operand ({'tokens' if cfg.weights_right else 'weights'}"
            f") needs >= 64 rows (wgmma, as the learner's GEMM), got {left_rows}"
        )


for _arch, _table in DECODE.items():
    for _, _cfg in _table:
        check_decode_config(_arch, _cfg)


def pick_decode(arch: str, m: int) -> DecodeConfig | None:
    """The decode config for `m` rows per weight, or None where the decode kernel does not
    serve `m` (more rows than its last bucket). Unknown architectures raise."""
    table = DECODE.get(arch)
    if table is None:
        raise ValueError(
            f"no pinned decode GEMM config for arch={arch!r} (pinned: {sorted(DECODE)}); add "
            "one to codegen/configs.py (an untested architecture is not guessed)"
        )
    for max_m, cfg in table:
        if m <= max_m:
            return cfg
    return None


def decode_dispatch(arch: str, m: int) -> DecodeConfig | None:
    """The decode config `launch_gemm` uses for a packed GEMM of `m` rows per weight, or None."""
    return pick_decode(arch, m) if arch in DECODE_DISPATCH else None


# ---------------------------------------------------------------------------------------------
# The batch-invariant (non-NVFP4) ops' tiles, rows of PINNED below (dtype "any"). What may and
# may not follow the batch:
# - linear: BLOCK_K is one value per architecture (asserted), the K loop is sequential, no
#   split-K; BLOCK_N and warps may follow M, BLOCK_M stays >= 64 on sm_90 (asserted): below 64
#   rows Triton emits mma.sync, which rounds differently from wgmma on cancellation-heavy data
#   (measured on the H200, see 3. above). `benchmarks/invariant_gpu_check.py` and the
#   CUDA run of tests/codegen re-check THESE buckets (rows of op(x[:m]) == rows of op(x)).
# - attention: ONE config for the learner's forward, prefill and decode. One config is not
#   enough by itself: the compiler picks register layouts per kernel VARIANT (the learner's causal
#   launch and the rollout's masked launch are two compiled kernels), and a `tl.sum` tree follows
#   that layout. On the H200 the two variants summed the softmax row in different orders (1 in
#   ~4096 attention outputs 1 bf16 ulp apart, enough to break strict alignment at batch >= 8);
#   the row sum is therefore an in-order FP32 dot. `tl.max` is exact in any order.
# - rms_norm / logprobs: one row per program; BLOCK_V is fixed per architecture (`LAUNCH`).

_LINEAR_SM90 = (
    (64, TileConfig(64, 64, 64, num_warps=4, num_stages=4)),
    (None, TileConfig(128, 128, 64, num_warps=8, num_stages=3)),
)
_LINEAR_INTERPRETER = ((None, TileConfig(16, 32, 32, num_warps=1, num_stages=1)),)
# attention: rows x keys per program (block_k unused: 0); one catch-all bucket (no M bucket)
_ATTENTION_SM90 = ((None, TileConfig(64, 64, 0, num_warps=4, num_stages=2)),)
_ATTENTION_INTERPRETER = ((None, TileConfig(16, 16, 0, num_warps=1, num_stages=1)),)
# backward of attention (determinism only): the dQ launch and the dK/dV launch, rows x keys
# (the fastest at the learner's shape: benchmarks/results/2026-12-04_tune_attention_10bb871.md)
_ATTENTION_DQ_SM90 = ((None, TileConfig(64, 64, 0, num_warps=4, num_stages=2)),)
_ATTENTION_DKDV_SM90 = ((None, TileConfig(64, 64, 0, num_warps=4, num_stages=2)),)


GEMM_OPS = ("nvfp4_gemm", "nvfp4_gemm_ongrid", "nvfp4_wgrad")

PINNED: dict[tuple[str, str, str], tuple] = {
    # op "nvfp4_gemm": A on-grid (bf16 on CUDA), B packed E2M1 + E4M3 scales or on-grid bf16.
    ("sm_90", "bf16", "nvfp4_gemm"): _GEMM_SM90,
    ("interpreter", "fp32", "nvfp4_gemm"): _GEMM_INTERPRETER,
    # op "nvfp4_gemm_ongrid": the same GEMM with B on-grid BF16 (same values, same bits).
    ("sm_90", "bf16", "nvfp4_gemm_ongrid"): _GEMM_ONGRID_SM90,
    ("interpreter", "fp32", "nvfp4_gemm_ongrid"): _GEMM_INTERPRETER,
    # op "nvfp4_wgrad": dW = q(dY^T) @ q(X^T)^T, both operands on-grid.
    ("sm_90", "bf16", "nvfp4_wgrad"): _WGRAD_SM90,
    ("interpreter", "fp32", "nvfp4_wgrad"): _GEMM_INTERPRETER,
    ("sm_90", "any", "nvfp4_quantize"): _QUANT_SM90,
    ("interpreter", "any", "nvfp4_quantize"): _QUANT_INTERPRETER,
    ("sm_90", "any", "nvfp4_quantize_segments"): _QUANT_SEGMENTS_SM90,
    ("interpreter", "any", "nvfp4_quantize_segments"): _QUANT_INTERPRETER,
    ("sm_90", "any", "nvfp4_weight_quantize"): _WEIGHT_QUANT_SM90,
    ("interpreter", "any", "nvfp4_weight_quantize"): _QUANT_INTERPRETER,
    # the batch-invariant ops (section above): BF16 linear, attention forward and backward
    ("sm_90", "any", "invariant_linear"): _LINEAR_SM90,
    ("interpreter", "any", "invariant_linear"): _LINEAR_INTERPRETER,
    ("sm_90", "any", "invariant_attention"): _ATTENTION_SM90,
    ("interpreter", "any", "invariant_attention"): _ATTENTION_INTERPRETER,
    ("sm_90", "any", "invariant_attention_dq"): _ATTENTION_DQ_SM90,
    ("interpreter", "any", "invariant_attention_dq"): _ATTENTION_INTERPRETER,
    ("sm_90", "any", "invariant_attention_dkdv"): _ATTENTION_DKDV_SM90,
    ("interpreter", "any", "invariant_attention_dkdv"): _ATTENTION_INTERPRETER,
}

for _key, _table in PINNED.items():
    assert len({c.block_k for _, c in _table}) == 1, f"{_key}: BLOCK_K must not depend on M"
    assert all(c.block_k % 32 == 0 and c.block_m % 16 == 0 for _, c in _table), _key
    if _key[0] == "sm_90" and _key[2] in (*GEMM_OPS, "invariant_linear"):  # wgmma, see 3. above
        assert all(c.block_m >= 64 for _, c in _table), f"{_key}: BLOCK_M < 64 is mma.sync"
for _key, (_max_n, _cfg) in NARROW_N.items():  # the same K chunk and MMA family as its table
    assert _cfg.block_k == PINNED[_key][0][1].block_k, f"{_key}: narrow BLOCK_K"
    assert _key[0] != "sm_90" or _cfg.block_m >= 64, f"{_key}: narrow BLOCK_M < 64 is mma.sync"
for _arch in ("sm_90", "interpreter"):  # packed, on-grid and wgrad GEMMs chunk K alike
    assert len({c.block_k for k, t in PINNED.items() if k[0] == _arch and k[2] in GEMM_OPS
                for _, c in t}) == 1, f"{_arch}: the GEMM ops must share BLOCK_K"  # fmt: skip


def pick(arch: str, dtype: str, op: str, m: int, n: int | None = None) -> TileConfig:
    """The pinned config for (arch, dtype, op) and the M bucket of `m`; `n` (a dense GEMM's
    output width, a static weight shape) picks the op's narrow config where N <= its max_n
    (`NARROW_N`). Unknown keys raise."""
    table = PINNED.get((arch, dtype, op))
    if table is None:
        known = sorted(k for k in PINNED if k[2] == op)
        raise ValueError(
            f"no pinned {op} config for arch={arch!r}, dtype={dtype!r} (pinned: {known}); "
            "add one to codegen/configs.py (an untested architecture is not guessed)"
        )
    narrow = NARROW_N.get((arch, dtype, op))
    for max_m, cfg in table:
        if max_m is None or m <= max_m:
            # the catch-all bucket of a narrow dense GEMM (small M keeps its small-M tile)
            if max_m is None and narrow is not None and n is not None and n <= narrow[0]:
                return narrow[1]
            return cfg
    raise AssertionError(f"{op} table for {arch} has no catch-all bucket")


def linear_config(arch: str, m: int) -> TileConfig:
    """The batch-invariant BF16 linear's tile for `m` rows (`PINNED`'s "invariant_linear")."""
    return pick(arch, "any", "invariant_linear", m)


def attention_config(arch: str) -> TileConfig:
    """The attention forward's ONE tile (learner, prefill and decode alike)."""
    return pick(arch, "any", "invariant_attention", 0)


def attention_backward_configs(arch: str) -> tuple[TileConfig, TileConfig]:
    """(dQ launch, dK/dV launch) tiles of the attention backward."""
    return (pick(arch, "any", "invariant_attention_dq", 0),
            pick(arch, "any", "invariant_attention_dkdv", 0))  # fmt: skip


# ---------------------------------------------------------------------------------------------
# Launch constants of every other kernel (elementwise, reductions, the quantizer's stages), ONE
# table: LAUNCH[(arch, op)] = {name: int}, read by
# `pick_launch(arch, op)`. `arch` is `runtime.arch_of`'s key; the "cuda" row serves every CUDA
# architecture without its own row, the "any" row every architecture. `num_warps` is passed
# only where a row names it (`warps_kwargs`; the interpreter takes none). Speed only unless the
# comment says the values are part of the bits (there they are the numerics' definition: never
# retune them without the bitwise tests).
LAUNCH: dict[tuple[str, str], dict[str, int]] = {
    # nvfp4/abs_max_kernel.row_abs_max and the per-row global stage of the quantizer
    # (global_scale_kernel.row_global_stage): rows per program, column chunk, warps (max is
    # exact in any order: no bit can change)
    ("cuda", "row_abs_max"): {"block_r": 4, "block_k": 1024, "num_warps": 4},
    ("interpreter", "row_abs_max"): {"block_r": 4, "block_k": 64, "num_warps": 1},
    # The expert weights' quantize: expert_groups 0 = the two-step form (the per-expert amax
    # pass, then the quantize kernel: two reads of every expert weight), G > 0 = the one-read
    # launch of `weight_quantize_kernel.py` with its programs in G expert groups. The same bits
    # either way. sm_90 stays 0 until a measurement names a faster G (`python -m
    # benchmarks.tune_kernels --only weights`: the one-read launch with one group was 1.8x
    # slower than the two-step form, benchmarks/results/2026-12-04_tune_kernels_weights_20b0dc2.md).
    ("any", "weight_quantize_experts"): {"expert_groups": 0},
    # nvfp4/weight_quantize_kernel's persistent grid: at most programs_per_sm per SM (fewer where
    # fewer fit, `_resident_per_sm`; tune_kernels' best); the interpreter runs `programs`
    # programs (several, so the tile striding is exercised on CPU too)
    ("cuda", "weight_quantize"): {"programs_per_sm": 8},
    ("interpreter", "weight_quantize"): {"programs": 3},
    # nvfp4/silu_mul_quantize_kernel (the experts' SwiGLU emitting the down GEMM's operand):
    # rows per program, SwiGLU column chunk, quantize column chunk, warps. Elementwise and
    # per-row math: no tiling changes a bit (tests/codegen/nvfp4/test_silu_mul_quantize.py
    # compares with the unfused kernels). Untuned: the unfused silu_mul kernel's tile and warps.
    ("any", "silu_mul_quantize"): {"block_r": 8, "block_c": 256, "block_k": 256, "num_warps": 4},
    # moe/row_scale_kernel's backward: rows per program, warps, most 64-column blocks per loop
    # step: speed only, every row's bits are its own (the fastest tiling, 0 bytes differing, in
    # benchmarks/results/2026-12-04_tune_kernels_rowscale_b168d97.md). Blocks per step: at most
    # this many, fewer where H is not a multiple of their width (`blocks_per_step`): a step
    # never holds a block wholly past H.
    ("cuda", "row_scale_backward"): {"block_r": 8, "num_warps": 2, "most_blocks": 4},
    ("interpreter", "row_scale_backward"): {"block_r": 8, "most_blocks": 4},
    # nvfp4/gemm_kernel.ongrid_weight: packed weight -> on-grid BF16, [block_r, block_k] tiles
    ("cuda", "ongrid_weight"): {"block_r": 32, "block_k": 128, "num_warps": 4},
    ("interpreter", "ongrid_weight"): {"block_r": 16, "block_k": 32},
    # nvfp4/expert_gather_backward_kernel: [block_t, block_c] tiles; block_s the inverse
    # permutation's elements per program
    ("cuda", "expert_gather_backward"): {
        "block_t": 8,
        "block_c": 256,
        "block_s": 1024,
        "num_warps": 4,
    },
    ("interpreter", "expert_gather_backward"): {"block_t": 8, "block_c": 256, "block_s": 1024},
    # nvfp4/abs_max_kernel.vector_abs_max: one program, elements per step (max: exact in any order)
    ("cuda", "vector_abs_max"): {"block": 4096, "num_warps": 8},
    ("interpreter", "vector_abs_max"): {"block": 256},
    # nvfp4/global_scale_kernel: amaxes per program of the elementwise global stage
    ("any", "amax_global"): {"block": 128, "num_warps": 1},
    # nvfp4/global_scale_kernel.expert_global_stage: rows per step of an expert's max
    ("cuda", "expert_global"): {"block": 1024, "num_warps": 4},
    ("interpreter", "expert_global"): {"block": 64},
    # nvfp4/abs_max_kernel.segment_column_abs_max: BLOCK_D = min(max_block_d, pow2(D)) columns,
    # BLOCK_T = tile_elements // BLOCK_D * 16 rows per step
    ("cuda", "segment_column_abs_max"): {"max_block_d": 256, "tile_elements": 512, "num_warps": 4},
    ("interpreter", "segment_column_abs_max"): {"max_block_d": 32, "tile_elements": 64},
    # nvfp4/segment_layout_kernel: BLOCK_E = min(max_block_e, pow2(E)) experts per step,
    # BLOCK_C = max(16, tile_elements // BLOCK_E) columns per program
    ("any", "segment_layout"): {"max_block_e": 128, "tile_elements": 2048},
    # invariant/attention_kernel.mask_args: int32 words (32 keys each) per step of a mask row
    ("cuda", "attention_mask_args"): {"block_w": 32},
    ("interpreter", "attention_mask_args"): {"block_w": 1},
    # invariant/logprobs_kernel: vocabulary entries per block (part of the bits: the sums walk
    # fixed BLOCK_V blocks from entry 0) and warps; no row for other architectures (not guessed)
    ("sm_90", "logprobs"): {"block_v": 4096, "num_warps": 8},
    ("interpreter", "logprobs"): {"block_v": 256, "num_warps": 1},
    # invariant/routing_kernel and routing_backward_kernel: one row of BLOCK_E = pow2(E) lanes
    # per program; `small_num_warps` where BLOCK_E <= small_block_e, else `num_warps`
    ("any", "routing"): {"small_block_e": 256, "small_num_warps": 1, "num_warps": 4},
    # invariant/rms_norm_kernel.rms_norm_launch (the norm, and the norm fused with its quantize):
    # BLOCK_H = pow2(H); rows per program max(1, min(max_rows, row_elements // BLOCK_H)); warps
    # min(max(BLOCK_H // columns_per_warp, 1), max_warps)
    ("any", "rms_norm"): {
        "row_elements": 2048,
        "max_rows": 16,
        "columns_per_warp": 256,
        "max_warps": 8,
    },
    # invariant/rms_norm_backward_kernel.tiling: rows per tile max(1, min(max_tile_rows,
    # tile_elements // pow2(H))), tiles_per_program tiles a program, warps min(max(rows x
    # pow2(H) // elements_per_warp, 1), max_warps). Part of the bits of dweight: rows per
    # program set the partial sums that `partial_sum` adds.
    ("any", "rms_norm_backward"): {
        "tile_elements": 4096,
        "max_tile_rows": 32,
        "tiles_per_program": 4,
        "elements_per_warp": 1024,
        "max_warps": 8,
    },
    # invariant/partial_sum_kernel: elements of one [BLOCK_H, CHAINS] tile, software-pipeline
    # stages of its row loop (a sweep on the H200; CHAINS, the order, is the kernel's own)
    ("cuda", "partial_sum"): {"tile_elements": 1024, "num_stages": 4, "num_warps": 2},
    ("interpreter", "partial_sum"): {"tile_elements": 1024, "num_stages": 4},
    # invariant/group_sum_kernel: columns per program
    ("cuda", "group_sum"): {"block": 1024, "num_warps": 4},
    ("interpreter", "group_sum"): {"block": 1024},
    # invariant/silu_mul_kernel (forward and backward): [block_r, block_c] tiles
    ("any", "silu_mul"): {"block_r": 8, "block_c": 256, "num_warps": 4},
    # invariant/gather_rows_kernel: [block_r, block_c] tiles
    ("any", "gather_rows"): {"block_r": 4, "block_c": 512, "num_warps": 4},
    # moe/combine_kernel: [block_t tokens, block_h columns] tiles
    ("cuda", "moe_combine"): {"block_t": 4, "block_h": 512, "num_warps": 4},
    ("interpreter", "moe_combine"): {"block_t": 4, "block_h": 512},
    # moe/row_scale_kernel (forward): [block_r, block_h] tiles
    ("cuda", "row_scale"): {"block_r": 16, "block_h": 256, "num_warps": 4},
    ("interpreter", "row_scale"): {"block_r": 16, "block_h": 256},
}


def pick_launch(arch: str, op: str) -> dict[str, int]:
    """The launch constants of `op` on `arch` (a copy): its own row, else the "cuda" row for a
    CUDA architecture, else the "any" row. Unknown keys raise."""
    keys = [(arch, op)] + ([("cuda", op)] if arch.startswith("sm_") else []) + [("any", op)]
    for key in keys:
        if key in LAUNCH:
            return dict(LAUNCH[key])
    known = sorted(k[0] for k in LAUNCH if k[1] == op)
    raise ValueError(
        f"no pinned {op} launch constants for arch={arch!r} (pinned: {known}); add a row to "
        "codegen/configs.py LAUNCH (an untested architecture is not guessed)"
    )


def warps_kwargs(row: dict[str, int]) -> dict[str, int]:
    """The launch keywords of a LAUNCH row: num_warps where the row names it, else none."""
    return {"num_warps": row["num_warps"]} if "num_warps" in row else {}
