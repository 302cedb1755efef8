"""Every pinned launch constant of codegen/, and nothing else. No runtime autotuning.

Two kinds of table, each read by its function only: tiles bucketed by M (`PINNED`, keyed by
(architecture, operand dtype, op), with its `NARROW_N` override, read by `pick`; the decode
GEMM's `DECODE`, keyed by architecture, read by `pick_decode`; the GEMMs' K chunk `K_CHUNK`,
read by `k_chunk`), and `LAUNCH` (kept in `launch_table.py`, re-exported here), every other
kernel's constants keyed by (architecture, op), read by `pick_launch`.

Why a GEMM's bits do not depend on the batch (M), the contract learner/rollout alignment rests on:
1. The K summation order is a property of (K, the op) alone (`K_CHUNK`): K is cut into chunks of
   KC, each chunk summed from zero by ONE ascending chain of MMAs into an FP32 accumulator, and
   the chunk partials added in one fixed order, ((p0 + p1) + p2) + ..., starting from p0. The
   learner does this inside one program; the decode GEMM may spread the chunks of an output over
   programs (split-K) and fold their FP32 partials in that same order (`nvfp4/k_chunks.py`):
   the same bits whatever the split count, the tile or M. No stream-K, no atomics.
2. BLOCK_K is one value per op and divides KC (asserted below); BLOCK_M / BLOCK_N / warps /
   stages and the decode split count may follow M.
3. BLOCK_M picks the MMA on sm_90: mma.sync below 64 rows, wgmma from 64, and they do NOT round
   alike (on the H200 a 16-row bucket and the per-expert call at 64 differed in 5 of 1088
   outputs on cancellation-heavy data, tests/codegen/nvfp4/test_nvfp4_kernels.py on CUDA). So
   every sm_90 bucket has BLOCK_M >= 64 (asserted). BLOCK_N and warps may still follow M (and
   a dense GEMM's N: `NARROW_N`); measured, not guaranteed: the CUDA run of tests/codegen and
   `tests/gpu/test_gpu_nvfp4.py` re-check THESE configs.
4. Rows never interact: masked rows load zeros, and the epilogue is per element.
5. The GEMM tables ("nvfp4_gemm" packed B, "nvfp4_gemm_ongrid" on-grid B, "nvfp4_wgrad") share
   BLOCK_K, and the forward tables share KC (asserted): packed and on-grid weights give the
   same bits, so the learner (on-grid from `gemm.ONGRID_FORWARD_MIN_ROWS` rows) and the
   rollout's decode (packed) agree.
On CPU the interpreter configs are checked for batch invariance by tests/codegen; on the H200 the
sm_90 buckets by the GPU script. `python -m tools.tune_kernels` times candidates offline
and counts the bytes each changes against the pinned config; a winner is copied here by hand.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

# the other launch constants, re-exported: every pinned number of codegen/ is read through here
from .launch_table import LAUNCH, pick_launch, unpinned, warps_kwargs  # noqa: F401


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
# B on-grid BF16: at M > 64 a wide N tile, 4 stages (192 KiB of shared memory), the fastest on
# the H200, 0 bytes differing (benchmarks/results/2026-12-05_tune_kernels_weights_20848a7.md, the
# 865d6a7 run). With K chunks (K_CHUNK > 0) it spills (the running total beside the
# accumulator: 255 registers) and runs at 0.29-0.35x; the non-spilling 128x128 tile then runs at
# 0.78-0.81x (1.00x at 1536 x 2048)
# (benchmarks/results/2026-12-06_learner_forward_k_chunks_e75494d.md, H100).
_GEMM_ONGRID_SM90 = (
    (64, TileConfig(64, 64, 64, num_warps=4, num_stages=4)),
    (None, TileConfig(128, 256, 64, num_warps=8, num_stages=4)),
)
# Weight gradients (dense and MoE share it: the MoE wgrad equals the per-expert loop). <= 512
# rows (k / v projections) would give 128x256 32 programs on 132 SMs: 64x128 there (H200, 0
# bytes differ: benchmarks/results/2026-12-05_tune_kernels_weights_20848a7.md, the 6fdd573 run).
_WGRAD_SM90 = (
    (512, TileConfig(64, 128, 64, num_warps=8, num_stages=4)),
    (None, TileConfig(128, 256, 64, num_warps=8, num_stages=3)),
)

# Narrow outputs (N <= max_n, a weight's static shape) of a dense GEMM, in place of the catch-all
# bucket: 128x256 gave the k / v projections' forward (N = 512) 64 programs at 4096 tokens (H200,
# 0 bytes differ, the wgrad's file above). (max_n, config)
_NARROW_ONGRID_SM90 = TileConfig(128, 128, 64, num_warps=8, num_stages=3)
NARROW_N = {("sm_90", "bf16", "nvfp4_gemm_ongrid"): (512, _NARROW_ONGRID_SM90)}

# Quantize: BLOCK_M (a multiple of 16) rows x BLOCK_K columns per program; the fastest on the H200,
# 0 bytes differ (all within 10%: benchmarks/results/2026-12-05_tune_kernels_weights_20848a7.md,
# the f330937 run).
_QUANT_SM90 = ((None, TileConfig(16, 0, 128, num_warps=2, num_stages=1)),)
_QUANT_INTERPRETER = ((None, TileConfig(16, 0, 64, num_warps=1, num_stages=1)),)
# The wgrad operands' transposing quantize, pinned apart (strided token loads; H200, 0 bytes
# differ: benchmarks/results/2026-12-05_tune_kernels_weights_20848a7.md, the 2c9e3e9 run).
_QUANT_SEGMENTS_SM90 = ((None, TileConfig(16, 0, 128, num_warps=2, num_stages=1)),)

# The weights' one-launch quantize (`weight_quantize_kernel.py`): 4 warps, so its persistent grid
# is resident whatever the register count; 32 x 128 tiles keep 32 elements per thread.
_WEIGHT_QUANT_SM90 = ((None, TileConfig(32, 0, 128, num_warps=4, num_stages=1)),)


@dataclass(frozen=True)
class DecodeConfig:
    """A tile of the few-row packed GEMM (`nvfp4/decode_gemm_kernel.py`): BLOCK_T tokens x
    BLOCK_W weight rows (the MMA's left operand: >= 64 on sm_90, wgmma as in the learner),
    BLOCK_K, warps, stages; speed only. `weights_right`: the learner's orientation instead (tokens
    the MMA's left operand, BLOCK_T >= 64 on sm_90; weights its right, through shared memory).
    `split_programs`: split K over programs until a launch has about this many (at most one
    split per K chunk; 0: never split); speed only, the bits are the split count's invariant
    (`nvfp4/k_chunks.py`)."""

    block_t: int
    block_w: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 4
    weights_right: bool = False
    split_programs: int = 0

    def splits(self, tile_programs: int, chunks: int) -> int:
        """The split count for a launch of `tile_programs` (token x weight tiles) over `chunks`
        K chunks: ceil(split_programs / tile_programs), between 1 and `chunks`."""
        if self.split_programs <= 0 or tile_programs <= 0:
            return 1
        return max(1, min(chunks, -(-self.split_programs // tile_programs)))

    launch_kwargs = TileConfig.launch_kwargs


# (max rows per weight inclusive, config): a packed forward GEMM of at most the last bucket's rows
# (per expert) runs the decode kernel; beyond, the tables above. The learner's bits (the kernel's
# docstring; tests/gpu/test_gpu_decode_gemm.py). Each bucket the sweep's fastest on the grouped
# decode shapes, within 7% of the fastest dense 8192^2 (H200, CUDA graphs:
# benchmarks/results/2026-12-05_decode_gemm_20848a7.md). split_programs (used only where K_CHUNK
# gives K several chunks; sm_90 pins one chain today): the split counts measured fastest with
# KC 1024 on an H100 (2026-12-06_decode_gemm_9ab3c45.md, split-K table): at M = 64 every shape's
# most splits (1024 programs: 8192^2 8, attn_o 4, attn_q and gate_up 2), at M <= 16 4-8 (528).
DECODE = {
    "sm_90": (
        (16, DecodeConfig(16, 64, 128, num_warps=4, num_stages=4, split_programs=528)),
        (64, DecodeConfig(64, 64, 128, num_warps=4, num_stages=3, split_programs=1024)),
    ),
    "interpreter": ((64, DecodeConfig(16, 32, 32, num_warps=1, num_stages=1, split_programs=8)),),
}
# Where `launch_gemm` sends few-row packed GEMMs to the decode kernel. Not the interpreter (its
# `tl.dot` sums in layout order): tests/codegen/nvfp4/test_decode_gemm.py calls it directly.
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
        unpinned("decode GEMM config", f"arch={arch!r}", DECODE)
    for max_m, cfg in table:
        if m <= max_m:
            return cfg
    return None


def decode_dispatch(arch: str, m: int) -> DecodeConfig | None:
    """The decode config `launch_gemm` uses for a packed GEMM of `m` rows per weight, or None."""
    return pick_decode(arch, m) if arch in DECODE_DISPATCH else None


# ---------------------------------------------------------------------------------------------
# The batch-invariant (non-NVFP4) ops' tiles, rows of PINNED (dtype "any"):
# - linear: as the GEMMs (1.-3. above: one BLOCK_K, sequential K, BLOCK_M >= 64 on sm_90, all
#   asserted); `tests/gpu/test_gpu_bucket_invariance.py` and the CUDA tests re-check THESE buckets.
# - attention: ONE config for the learner's forward, prefill and decode. Not enough by itself:
#   register layouts differ per kernel VARIANT (causal vs masked launch) and a `tl.sum` tree
#   follows them (on the H200 1 in ~4096 outputs 1 bf16 ulp apart), so the row sum is an
#   in-order FP32 dot. Backward: determinism only.

_LINEAR_SM90 = (
    (64, TileConfig(64, 64, 64, num_warps=4, num_stages=4)),
    (None, TileConfig(128, 128, 64, num_warps=8, num_stages=3)),
)
_LINEAR_INTERPRETER = ((None, TileConfig(16, 32, 32, num_warps=1, num_stages=1)),)
# attention: rows x keys per program (block_k unused: 0), no M bucket
_ATTENTION_SM90 = ((None, TileConfig(64, 64, 0, num_warps=4, num_stages=2)),)
_ATTENTION_INTERPRETER = ((None, TileConfig(16, 16, 0, num_warps=1, num_stages=1)),)
# dQ and dK/dV launches (the fastest: benchmarks/results/2026-12-04_tune_attention_mask_c9bc48f.md,
# the 10bb871 run)
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
    assert (
        len(
            {
                c.block_k
                for k, t in PINNED.items()
                if k[0] == _arch and k[2] in GEMM_OPS
                for _, c in t
            }
        )
        == 1
    ), f"{_arch}: the GEMM ops must share BLOCK_K"


# The K chunk KC of each GEMM op's summation order (1. above): a property of (arch, op), never of
# M. The forward ops (packed and on-grid B: the learner's forward and dgrad, the rollout's
# decode) share it; 0 = one chain over all of K. sm_90 pins 0: measured on an H100, KC = 1024
# lets the decode GEMM split K (8192^2: 1.43x cuBLAS BF16 at M = 1, 1.33x at 16, 0.97x at 64,
# every split bitwise == the learner: 2026-12-06_decode_gemm_9ab3c45.md) but costs the learner's
# forward GEMM 19-22% (no tile both fast and spill-free holds the chunk total:
# 2026-12-06_learner_forward_k_chunks_e75494d.md), past the 3% it may cost. The interpreter pins
# 128, so the chunked kernels (learner fold, split decode, fold_chunks) stay proven in CI.
K_CHUNK: dict[tuple[str, str], int] = {
    ("sm_90", "nvfp4_gemm"): 0,
    ("sm_90", "nvfp4_gemm_ongrid"): 0,
    ("sm_90", "nvfp4_wgrad"): 0,
    ("interpreter", "nvfp4_gemm"): 128,
    ("interpreter", "nvfp4_gemm_ongrid"): 128,
    ("interpreter", "nvfp4_wgrad"): 0,
}
FORWARD_GEMM_OPS = ("nvfp4_gemm", "nvfp4_gemm_ongrid")  # one K order: learner, dgrad, decode


def _block_ks(arch: str, op: str) -> set[int]:
    """Every BLOCK_K a pinned config of `op` on `arch` uses (the decode GEMM's with nvfp4_gemm)."""
    blocks = {c.block_k for k, t in PINNED.items() if k[0] == arch and k[2] == op for _, c in t}
    if op == "nvfp4_gemm":
        blocks |= {c.block_k for _, c in DECODE[arch]}
    return blocks


for (_arch, _op), _kc in K_CHUNK.items():
    assert _kc == 0 or all(_kc % b == 0 for b in _block_ks(_arch, _op)), (
        f"{_arch} {_op}: BLOCK_K must divide KC"
    )
for _arch in ("sm_90", "interpreter"):  # packed and on-grid forward: the same order
    assert K_CHUNK[(_arch, "nvfp4_gemm")] == K_CHUNK[(_arch, "nvfp4_gemm_ongrid")], _arch


def check_k_chunk(arch: str, kc: int) -> None:
    """A ValueError, naming kc, where `kc` could not be the forward GEMMs' K chunk on `arch`:
    not 0 or a multiple of every BLOCK_K of `FORWARD_GEMM_OPS`."""
    for op in FORWARD_GEMM_OPS:
        blocks = _block_ks(arch, op)
        if not isinstance(kc, int) or kc < 0 or (kc and any(kc % b for b in blocks)):
            raise ValueError(
                f"K chunk kc={kc!r}: must be 0 or a multiple of every BLOCK_K of {op} on {arch} "
                f"({sorted(blocks)})"
            )


@contextmanager
def what_if_k_chunk(arch: str, kc: int):
    """A what-if for benchmarks and tests (never the pinned order): inside the block both forward
    GEMM ops of `arch` (`FORWARD_GEMM_OPS`: the learner's forward and dgrad, the decode) sum K in
    chunks of `kc` (0: one chain), so learner and decode still agree; the pinned rows come back
    after. Kernels read `k_chunk` at each call: a CUDA graph captured inside keeps `kc`. Raises
    `check_k_chunk`'s ValueError before anything changes."""
    check_k_chunk(arch, kc)
    pinned = {op: K_CHUNK[(arch, op)] for op in FORWARD_GEMM_OPS}
    K_CHUNK.update({(arch, op): kc for op in FORWARD_GEMM_OPS})
    try:
        yield
    finally:
        K_CHUNK.update({(arch, op): v for op, v in pinned.items()})


def k_chunk(arch: str, op: str) -> int:
    """KC of `op`'s K summation order on `arch` (0: one chain over all of K). Unknown keys
    raise."""
    if (arch, op) not in K_CHUNK:
        unpinned(f"{op} K chunk", f"arch={arch!r}", [k[0] for k in K_CHUNK if k[1] == op])
    return K_CHUNK[(arch, op)]


def pick(arch: str, dtype: str, op: str, m: int, n: int | None = None) -> TileConfig:
    """The pinned config for (arch, dtype, op) and the M bucket of `m`; `n` (a dense GEMM's
    output width, a static weight shape) picks the op's narrow config where N <= its max_n
    (`NARROW_N`). Unknown keys raise."""
    table = PINNED.get((arch, dtype, op))
    if table is None:
        unpinned(
            f"{op} config", f"arch={arch!r}, dtype={dtype!r}", [k for k in PINNED if k[2] == op]
        )
    narrow = NARROW_N.get((arch, dtype, op))
    for max_m, cfg in table:
        if max_m is None or m <= max_m:
            # the catch-all bucket of a narrow dense GEMM (small M keeps its small-M tile)
            if max_m is None and narrow is not None and n is not None and n <= narrow[0]:
                return narrow[1]
            return cfg
    raise AssertionError(f"{op} table for {arch} has no catch-all bucket")
