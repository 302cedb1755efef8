"""Pinned Triton configs of the batch-invariant ops, keyed by (architecture, op). No autotuning.

What may and may not follow the batch:
- linear: BLOCK_K is one value per architecture (asserted), the K loop is sequential, no
  split-K; BLOCK_N and warps may follow M, BLOCK_M stays >= 64 on sm_90 (asserted): below 64
  rows Triton emits mma.sync, which rounds differently from wgmma on cancellation-heavy data
  (measured on the H200, see codegen/configs.py). `benchmarks/invariant_gpu_check.py` and the
  CUDA run of tests/codegen re-check THESE buckets (rows of op(x[:m]) == rows of op(x)).
- attention: ONE config for the learner's forward, prefill and decode. One config is not
  enough by itself: the compiler picks register layouts per kernel VARIANT (the learner's causal
  launch and the rollout's masked launch are two compiled kernels), and a `tl.sum` tree follows
  that layout. On the H200 the two variants summed the softmax row in different orders (1 in
  ~4096 attention outputs 1 bf16 ulp apart, enough to break strict alignment at batch >= 8);
  the row sum is therefore an in-order FP32 dot. `tl.max` is exact in any order.
- rms_norm / logprobs: one row per program; BLOCK_V is fixed per architecture.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KernelConfig:
    block_m: int = 0
    block_n: int = 0
    block_k: int = 0
    num_warps: int = 4
    num_stages: int = 1

    def launch_kwargs(self) -> dict:
        return {"num_warps": self.num_warps, "num_stages": self.num_stages}


# (max_m inclusive, or None for "any larger", config)
LINEAR = {
    "sm_90": (
        (64, KernelConfig(64, 64, 64, num_warps=4, num_stages=4)),
        (None, KernelConfig(128, 128, 64, num_warps=8, num_stages=3)),
    ),
    "interpreter": ((None, KernelConfig(16, 32, 32, num_warps=1)),),
}
ATTENTION = {
    "sm_90": KernelConfig(64, 64, 0, num_warps=4, num_stages=2),
    "interpreter": KernelConfig(16, 16, 0, num_warps=1),
}
# backward of attention (determinism only): (dQ launch: rows x keys, dK/dV launch: rows x keys)
# (*) both launches at the learner's shape, `benchmarks.tune_attention`,
# benchmarks/results/2026-12-04_tune_attention_10bb871.md
ATTENTION_BACKWARD = {
    "sm_90": (
        KernelConfig(64, 64, 0, num_warps=4, num_stages=2),
        KernelConfig(64, 64, 0, num_warps=4, num_stages=2),  # 8 warps: 0.47 -> 0.31 ms (*)
    ),
    "interpreter": (KernelConfig(16, 16, 0, num_warps=1), KernelConfig(16, 16, 0, num_warps=1)),
}
LOGPROBS_BLOCK_V = {"sm_90": 4096, "interpreter": 256}

for _arch, _table in LINEAR.items():
    assert len({c.block_k for _, c in _table}) == 1, f"{_arch}: linear BLOCK_K must not follow M"
    if _arch.startswith("sm_9"):
        assert all(c.block_m >= 64 for _, c in _table), f"{_arch}: BLOCK_M < 64 is mma.sync"


def _known(arch: str, table: dict, op: str):
    if arch not in table:
        raise ValueError(
            f"no pinned {op} config for arch={arch!r} (pinned: {sorted(table)}); add one to "
            "codegen/invariant_configs.py (an untested architecture is not guessed)"
        )
    return table[arch]


def linear_config(arch: str, m: int) -> KernelConfig:
    for max_m, cfg in _known(arch, LINEAR, "linear"):
        if max_m is None or m <= max_m:
            return cfg
    raise AssertionError("linear table has no catch-all bucket")


def attention_config(arch: str) -> KernelConfig:
    return _known(arch, ATTENTION, "attention")


def attention_backward_configs(arch: str) -> tuple[KernelConfig, KernelConfig]:
    return _known(arch, ATTENTION_BACKWARD, "attention backward")


def logprobs_block_v(arch: str) -> int:
    return _known(arch, LOGPROBS_BLOCK_V, "logprobs")
