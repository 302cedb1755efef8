"""`LAUNCH`: the launch constants of every codegen kernel that is not a GEMM-like tile
(`configs.py` holds those and re-exports this table), keyed by (architecture, op) and read by
`pick_launch`. No runtime autotuning."""

from __future__ import annotations

from typing import NoReturn


def unpinned(what: str, key: str, known) -> NoReturn:
    """The ValueError for a key no table pins (an untested architecture is not guessed)."""
    raise ValueError(
        f"no pinned {what} for {key} (pinned: {sorted(known)}); add one to codegen/configs.py "
        "(an untested architecture is not guessed)"
    )


# Launch constants of every other kernel (elementwise, reductions, the quantizer's stages), ONE
# table: LAUNCH[(arch, op)] = {name: int}, read by `pick_launch(arch, op)` (`runtime.arch_of`'s
# key; the "cuda" row serves every CUDA architecture without its own row, "any" every one).
# `num_warps` is passed only where a row names it (`warps_kwargs`). Speed only, unless a comment
# says the values are part of the bits (never retune those without the bitwise tests).
LAUNCH: dict[tuple[str, str], dict[str, int]] = {
    # nvfp4/abs_max_kernel (max: exact in any order) and the quantizer's per-row global stage:
    # row_abs_max rows x column chunk; vector_abs_max one program's step; segment_column_abs_max
    # BLOCK_D = min(max_block_d, pow2(D)) columns, BLOCK_T = tile_elements // BLOCK_D * 16 rows
    ("cuda", "row_abs_max"): dict(block_r=4, block_k=1024, num_warps=4),
    ("interpreter", "row_abs_max"): dict(block_r=4, block_k=64, num_warps=1),
    # chunk_abs_max: [block_r, block_k] tiles (the per-row quantize's split form: fewer rows
    # than row_quantize's split_rows_below take chunk maxima, then `row_codes`; the same bits)
    ("cuda", "chunk_abs_max"): dict(block_r=2, block_k=256, num_warps=4),
    ("interpreter", "chunk_abs_max"): dict(block_r=4, block_k=64),
    ("cuda", "row_quantize"): dict(split_rows_below=256),
    ("interpreter", "row_quantize"): dict(split_rows_below=16),
    ("cuda", "vector_abs_max"): dict(block=4096, num_warps=8),
    ("interpreter", "vector_abs_max"): dict(block=256),
    ("cuda", "segment_column_abs_max"): dict(max_block_d=256, tile_elements=512, num_warps=4),
    ("interpreter", "segment_column_abs_max"): dict(max_block_d=32, tile_elements=64),
    # nvfp4/global_scale_kernel: amaxes per program; rows per step of an expert's max
    ("any", "amax_global"): dict(block=128, num_warps=1),
    ("cuda", "expert_global"): dict(block=1024, num_warps=4),
    ("interpreter", "expert_global"): dict(block=64),
    # Expert weights: expert_groups 0 = the two-step quantize (amax pass, then codes), G > 0 =
    # `weight_quantize_kernel.py`'s one read in G expert groups; the same bits (one group was
    # 1.8x slower: benchmarks/results/2026-12-05_tune_kernels_weights_20848a7.md, the 20b0dc2
    # run). Its persistent grid: at most programs_per_sm per SM (fewer where fewer fit);
    # `programs` in the interpreter
    ("any", "weight_quantize_experts"): dict(expert_groups=0),
    ("cuda", "weight_quantize"): dict(programs_per_sm=8),
    ("interpreter", "weight_quantize"): dict(programs=3),
    # nvfp4/silu_mul_quantize_kernel: rows, SwiGLU and quantize column chunks (per-row math: no
    # tiling changes a bit, tests/codegen/nvfp4/test_silu_mul_quantize.py); fewer rows than
    # split_rows_below take the split form ([split_block_r, split_block_c] tiles of out and
    # their maxima, then `row_codes`: the same bits), so that batch 1 is not one program; the
    # split rows are first guesses for few rows on 132 SMs, untuned
    ("cuda", "silu_mul_quantize"): dict(
        block_r=8,
        block_c=256,
        block_k=256,
        num_warps=4,
        split_rows_below=1024,
        split_block_r=2,
        split_block_c=128,
    ),
    ("interpreter", "silu_mul_quantize"): dict(
        block_r=8,
        block_c=256,
        block_k=256,
        num_warps=4,
        split_rows_below=32,
        split_block_r=4,
        split_block_c=64,
    ),
    # nvfp4/rms_norm_quantize_kernel: fewer rows than split_rows_below take the split form
    # (the norm and row maxima, then `row_codes`: the same bits); untuned
    ("cuda", "rms_norm_quantize"): dict(split_rows_below=256),
    ("interpreter", "rms_norm_quantize"): dict(split_rows_below=16),
    # nvfp4/row_codes_kernel (the split form's quantize of the fused quantize kernels): rows x
    # block_k columns per program, block_p partial maxima per step of their fold (max: exact in
    # any order; speed only); untuned
    ("cuda", "row_codes"): dict(block_r=2, block_k=128, block_p=128, num_warps=4),
    ("interpreter", "row_codes"): dict(block_r=4, block_k=32, block_p=4),
    # nvfp4/ongrid_weight_kernel.ongrid_weight (packed weight -> on-grid BF16): [block_r, block_k] tiles
    ("cuda", "ongrid_weight"): dict(block_r=32, block_k=128, num_warps=4),
    ("interpreter", "ongrid_weight"): dict(block_r=16, block_k=32),
    # nvfp4/k_chunks.fold_chunks (split-K decode's fold of the chunk partials): [block_r, block_c]
    # tiles; per-element sums in a fixed order, so speed only
    ("cuda", "fold_chunks"): dict(block_r=16, block_c=128, num_warps=4),
    ("interpreter", "fold_chunks"): dict(block_r=16, block_c=32),
    # nvfp4/expert_gather_backward_kernel: [block_t, block_c] tiles; block_s per program of the
    # inverse permutation
    ("cuda", "expert_gather_backward"): dict(block_t=8, block_c=256, block_s=1024, num_warps=4),
    ("interpreter", "expert_gather_backward"): dict(block_t=8, block_c=256, block_s=1024),
    # nvfp4/segment_layout_kernel: BLOCK_E = min(max_block_e, pow2(E)) experts per step,
    # BLOCK_C = max(16, tile_elements // BLOCK_E) columns per program
    ("any", "segment_layout"): dict(max_block_e=128, tile_elements=2048),
    # invariant/attention_masks.mask_args: int32 words (32 keys each) per step of a mask row
    ("cuda", "attention_mask_args"): dict(block_w=32),
    ("interpreter", "attention_mask_args"): dict(block_w=1),
    # invariant/position_mask_kernel: int32 words (32 keys each) per step of a mask row
    # (integers: speed only)
    ("cuda", "position_mask"): dict(block_w=32, num_warps=4),
    ("interpreter", "position_mask"): dict(block_w=2),
    # invariant/rotary_tables_kernel: one row of positions per program (elementwise: speed only)
    ("cuda", "rotary_tables"): dict(num_warps=1),
    ("interpreter", "rotary_tables"): dict(),
    # invariant/logprobs_kernel: vocabulary entries per block (part of the bits: the sums walk
    # fixed BLOCK_V blocks from entry 0); no row for other architectures (not guessed)
    ("sm_90", "logprobs"): dict(block_v=4096, num_warps=8),
    ("interpreter", "logprobs"): dict(block_v=256, num_warps=1),
    # invariant/gumbel_noise_kernel: vocabulary entries per program (elementwise: speed only)
    ("cuda", "gumbel_noise"): dict(block_v=1024, num_warps=4),
    ("interpreter", "gumbel_noise"): dict(block_v=64),
    # invariant/sample_argmax_kernel: vocabulary entries per step of a program, and per program
    # (chunk_v: a row's chunks spread its FP64 noise over the GPU at batch 1); an exact
    # first-maximum selection: speed only (not tuned); the interpreter's sizes split the test
    # vocabularies into several blocks and chunks
    ("cuda", "sample_argmax"): dict(block_v=1024, chunk_v=8192, num_warps=4),
    ("interpreter", "sample_argmax"): dict(block_v=32, chunk_v=64),
    # invariant/decode_advance_kernel: rows per program (one program for a decode bucket of up
    # to block_b rows; integer bookkeeping: speed only)
    ("cuda", "decode_advance"): dict(block_b=256, num_warps=4),
    ("interpreter", "decode_advance"): dict(block_b=4),
    # invariant/kv_cache_write_kernel: one program per (sequence, head, token) row of D lanes
    # (a copy: speed only)
    ("cuda", "kv_cache_write"): dict(num_warps=1),
    ("interpreter", "kv_cache_write"): dict(),
    # invariant/routing_kernel and routing_backward_kernel: BLOCK_E = pow2(E) lanes per row;
    # `small_num_warps` where BLOCK_E <= small_block_e, else `num_warps`
    ("any", "routing"): dict(small_block_e=256, small_num_warps=1, num_warps=4),
    # invariant/rms_norm_kernel.rms_norm_launch (also the norm fused with its quantize):
    # BLOCK_H = pow2(H); rows per program max(1, min(max_rows, row_elements // BLOCK_H)); warps
    # min(max(BLOCK_H // columns_per_warp, 1), max_warps)
    ("any", "rms_norm"): dict(row_elements=2048, max_rows=16, columns_per_warp=256, max_warps=8),
    # invariant/rms_norm_backward_kernel.tiling: rows per tile max(1, min(max_tile_rows,
    # tile_elements // pow2(H))), tiles_per_program per program, warps min(max(rows x pow2(H) //
    # elements_per_warp, 1), max_warps). Part of dweight's bits (a program's partial sum).
    ("any", "rms_norm_backward"): dict(
        tile_elements=4096,
        max_tile_rows=32,
        tiles_per_program=4,
        elements_per_warp=1024,
        max_warps=8,
    ),
    # invariant/partial_sum_kernel: elements of a [BLOCK_H, CHAINS] tile, row-loop stages (an
    # H200 sweep; CHAINS, the order, is the kernel's own); group_sum_kernel: columns per program
    ("cuda", "partial_sum"): dict(tile_elements=1024, num_stages=4, num_warps=2),
    ("interpreter", "partial_sum"): dict(tile_elements=1024, num_stages=4),
    ("cuda", "group_sum"): dict(block=1024, num_warps=4),
    ("interpreter", "group_sum"): dict(block=1024),
    # invariant/silu_mul_kernel (forward and backward), invariant/gather_rows_kernel: tiles
    ("any", "silu_mul"): dict(block_r=8, block_c=256, num_warps=4),
    ("any", "gather_rows"): dict(block_r=4, block_c=512, num_warps=4),
    # moe/combine_kernel: [block_t tokens, block_h columns] tiles; moe/row_scale_kernel: the
    # forward's tiles, the backward's rows and most 64-column blocks per step (fewer where H is
    # not a multiple of their width; every row's bits its own; the fastest, 0 bytes differing:
    # benchmarks/results/2026-12-05_tune_kernels_weights_20848a7.md, the b168d97 run)
    ("cuda", "moe_combine"): dict(block_t=4, block_h=512, num_warps=4),
    ("interpreter", "moe_combine"): dict(block_t=4, block_h=512),
    ("cuda", "row_scale"): dict(block_r=16, block_h=256, num_warps=4),
    ("interpreter", "row_scale"): dict(block_r=16, block_h=256),
    ("cuda", "row_scale_backward"): dict(block_r=8, num_warps=2, most_blocks=4),
    ("interpreter", "row_scale_backward"): dict(block_r=8, most_blocks=4),
    # moe/expert_order_kernel: ONE program walks the S = T x k slots in block_s chunks (twice:
    # the per-expert counts, then each slot's place) for up to max_slots slots and max_experts
    # experts; larger calls run the torch composition (the same integers). Integer bookkeeping
    # whose results are exact: speed only
    ("cuda", "expert_order"): dict(block_s=128, max_slots=4096, max_experts=256, num_warps=4),
    ("interpreter", "expert_order"): dict(block_s=8, max_slots=4096, max_experts=256),
    # moe/routing_order_kernel: ONE program routes the T tokens block_t rows at a time (each row
    # its own bits: `invariant/routing_kernel.route_rows`), then runs expert_order's two passes
    # (its row above: block_s, the limits); rows per step: speed only
    ("cuda", "routing_order"): dict(block_t=16, num_warps=4),
    ("interpreter", "routing_order"): dict(block_t=4),
}


def pick_launch(arch: str, op: str) -> dict[str, int]:
    """The launch constants of `op` on `arch` (a copy): its own row, else the "cuda" row for a
    CUDA architecture, else the "any" row. Unknown keys raise."""
    keys = [(arch, op)] + ([("cuda", op)] if arch.startswith("sm_") else []) + [("any", op)]
    for key in keys:
        if key in LAUNCH:
            return dict(LAUNCH[key])
    unpinned(f"{op} launch constants", f"arch={arch!r}", [k[0] for k in LAUNCH if k[1] == op])


def warps_kwargs(row: dict[str, int]) -> dict[str, int]:
    """The launch keywords of a LAUNCH row: num_warps where the row names it, else none."""
    return {"num_warps": row["num_warps"]} if "num_warps" in row else {}
