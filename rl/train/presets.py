"""Training presets: one named function each, returning a `TrainConfig` for a variant.

A preset is a whole GRPO run (model, task, schedule); the variant picks its numerics recipe
(`NVFP4Recipe`).

    minite train tiny                    # CPU, 2 cores: ~1 min cold, ~20 s warm; writes
                                         # runs/tiny-strict, run again: runs/tiny-strict-2, ...
    minite train tiny --variant te       # NVFP4 per-tensor scales + token TIS (cap 2)
    minite train h200-moe --variant bf16 # small Qwen3-MoE on the H200, about 2 minutes
    minite train h200-evidence           # 28M Qwen3-MoE, 150 GRPO steps on 6-digit sort (H200)
    minite train tiny model=DIR          # a local transformers checkpoint (its tokenizer and
                                         # chat template) instead of the random-init model
    minite train tiny-rg                 # the tiny model on reasoning-gym's chain_sum
    minite train tiny task=rg:spell_backward   # any preset on a reasoning-gym task

Variants: "strict" (NVFP4Recipe.strict(): W4A4, batch-invariant, learner == rollout bitwise),
"te" (NVFP4Recipe.te(): per-tensor activation amax, NOT invariant, so the rollout is corrected by
token-level truncated IS with cap 2), "bf16" (NVFP4Recipe.bf16(): same kernels, no quantization).
"""

from __future__ import annotations

import dataclasses

from .config import VARIANTS, TrainConfig


def _variant(cfg: TrainConfig, variant: str) -> TrainConfig:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    changes = {"variant": variant, "out_dir": f"runs/{cfg.name}-{variant}"}
    if variant == "te":
        changes["tis_cap"] = 2.0
    return dataclasses.replace(cfg, **changes)


def tiny(variant: str = "strict") -> TrainConfig:
    """2-layer Qwen3 (hidden 64, 4 heads / 2 KV heads, head_dim 32), sorting 4 digits, CPU with
    2 cores. A short warm start gets some answers right; GRPO then raises the reward. Every
    batch has one shape (8 prompts x 8 samples, width 11), so the learner compiles once."""
    cfg = TrainConfig(
        name="tiny",
        arch="qwen3",
        hidden=64,
        layers=2,
        heads=4,
        kv_heads=2,
        head_dim=32,
        intermediate=128,
        task="sort",
        num_digits=4,
        partial_credit=0.5,
        prompts_per_step=8,
        group_size=8,
        temperature=1.0,
        steps=30,
        lr=5e-4,
        clip_low=0.2,
        clip_high=0.28,
        aggregation="token",
        warm_start_steps=60,
        warm_start_lr=3e-3,
        warm_start_batch=64,
        seed=0,
        device="cpu",
        compile=True,
        checkpoint_every=10,
    )
    return _variant(cfg, variant)


def tiny_rg(variant: str = "strict") -> TrainConfig:
    """The tiny model and schedule on a reasoning-gym task (needs the extra `minite[tasks]`):
    `rg:chain_sum`, two-term sums of 1-2 digit numbers behind reasoning-gym's own 60-character
    question, so the width is 74 tokens (70 prompt + 4 answer) instead of sort's 11."""
    return _variant(
        dataclasses.replace(tiny(variant), name="tiny-rg", task="rg:chain_sum"), variant
    )


def h200_moe(variant: str = "strict") -> TrainConfig:
    """Small Qwen3-MoE (hidden 512, 4 layers, 16 experts / 4 active) on the H200: addition and
    sorting mixed, 64 prompts x 8 samples per step, 40 steps, about 2 minutes per variant
    (measured: benchmarks/results/2026-12-02_grpo_h200-moe.md, reward 0.51 -> 0.59). The warm
    start is kept short on purpose: 600 steps solved the task (reward 1.0 at step 0) and GRPO
    then only had room to go down (the same file, its overtrained warm start section)."""
    cfg = TrainConfig(
        name="h200-moe",
        arch="qwen3_moe",
        hidden=512,
        layers=4,
        heads=8,
        kv_heads=4,
        head_dim=64,
        intermediate=1024,
        experts=16,
        experts_per_token=4,
        moe_intermediate=256,
        task="mix",
        num_digits=3,
        partial_credit=0.5,
        prompts_per_step=64,
        group_size=8,
        temperature=1.0,
        steps=40,
        lr=2e-4,
        clip_low=0.2,
        clip_high=0.28,
        aggregation="token",
        warm_start_steps=150,
        warm_start_lr=1e-3,
        warm_start_batch=256,
        seed=0,
        device="cuda",
        compile=True,
        checkpoint_every=20,
    )
    return _variant(cfg, variant)


def h200_evidence(variant: str = "strict") -> TrainConfig:
    """The H200 evidence run: does NVFP4 GRPO learn like BF16? The h200-moe model (Qwen3-MoE,
    hidden 512, 4 layers, 16 experts / 4 active: 28.4M parameters) on sorting 6 digits (10^6
    prompts, 1/8 of them held out, so nothing memorized from training can pass the held-out
    set), warm-started 80 steps, then 150 GRPO steps of 64 prompts x 8 samples, and greedy
    held-out accuracy on 512 problems every 10 steps. The warm start is sized to leave room:
    in h200-moe, 150 steps with 128 sort problems each took 3-digit sort to a sampled reward of
    0.83 and GRPO to 0.95 within 12 steps, so 6 digits with 80 x 256 problems should start
    well below the ceiling (an estimate: the run reports where it starts).

    `python -m benchmarks.grpo_evidence` runs strict / bf16 / te with the same seeds in one
    device call. Estimated cost (not yet measured), scaled from h200-moe's 0.46 / 0.26 / 0.44 s
    per step strict / bf16 / te (width 14 -> 17 tokens, 5 -> 7 decode steps) and its 25-47 s
    of start-up per run: about 0.6 / 0.35 / 0.55 s per step, 140-180 / 80 / 110 s per run with
    compilation and 16 evaluations (the warm start runs once, in the first)."""
    cfg = dataclasses.replace(
        h200_moe(variant),
        name="h200-evidence",
        task="sort",
        num_digits=6,
        steps=150,
        warm_start_steps=80,
        eval_every=10,
        eval_size=512,
        checkpoint_every=150,
        keep_checkpoints=1,
    )
    return _variant(cfg, variant)


def h200_evidence_dense(variant: str = "strict") -> TrainConfig:
    """`h200-evidence` with a dense Qwen3 (hidden 512, 6 layers, intermediate 2048: 23.6M
    parameters), the same task, schedule and seeds."""
    cfg = dataclasses.replace(
        h200_evidence(variant),
        name="h200-evidence-dense",
        arch="qwen3",
        layers=6,
        intermediate=2048,
    )
    return _variant(cfg, variant)


PRESETS = {
    "tiny": tiny,
    "tiny-rg": tiny_rg,
    "h200-moe": h200_moe,
    "h200-evidence": h200_evidence,
    "h200-evidence-dense": h200_evidence_dense,
}


def get_preset(name: str, variant: str = "strict") -> TrainConfig:
    if name not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {name!r}")
    return PRESETS[name](variant)
