# ruff: noqa: B023  (each benchmarked closure is timed immediately, inside its own iteration)
"""Offline tuner of the invariant attention's pinned configs (`codegen/configs.py`)
on the learner's shape: causal, 8 sequences x 512 tokens, 32 query / 4 key-value heads, head
dim 128 (Qwen3-30B-A3B), bf16.

    python -m tools.tune_attention [--only forward,dq,dkdv] [--variants causal,mask]

Two launch variants: `causal` (is_causal, no mask tensor) and `mask` (the same causal pattern
as a boolean [B, 1, T, T] tensor: what transformers builds under torch.compile, so what the
learner runs).

- forward: each candidate config is timed and checked for what the forward's contract needs
  (`invariant ok`: a sequence decoded token by token at a few positions and alone in a batch
  of one equals its rows of the batched causal forward, bitwise) and against the pinned
  config's output (`differ`: a new config changes bits, so pinning it needs the GPU alignment
  run, `pytest -m gpu tests/gpu/test_gpu_alignment.py`).
- dq / dkdv: the backward (determinism only) timed whole, one launch's config varied at a time;
  `differ` against the pinned backward. (A dK/dV launch that split the GQA group over programs,
  FP32 partials added after, was slower at every split: 2026-12-04_tune_attention_mask_c9bc48f.md,
  the 10bb871 run.)
Baselines in the same run: `F.scaled_dot_product_attention` (cuDNN / flash) forward, and
forward + backward. Nothing here is read at run time: a winner is copied into
configs.py by hand. Figures: H200, bf16 attention (no NVFP4 in these kernels).
"""

from __future__ import annotations

import argparse
import contextlib
import json

import torch

from benchmarks.common import environment, write_results
from benchmarks.common import median_ms as bench
from fp4_compile.codegen import configs as cfgs
from fp4_compile.codegen.configs import TileConfig
from fp4_compile.testing import count_bytes_differ

B, HQ, HKV, T, D = 8, 32, 4, 512, 128
ARCH = "sm_90"
FORWARD_CANDIDATES = (
    TileConfig(64, 64, 0, num_warps=4, num_stages=3),
    TileConfig(128, 64, 0, num_warps=8, num_stages=2),
    TileConfig(128, 64, 0, num_warps=8, num_stages=3),
    TileConfig(64, 128, 0, num_warps=4, num_stages=2),
    TileConfig(128, 128, 0, num_warps=8, num_stages=2),
    TileConfig(64, 32, 0, num_warps=4, num_stages=3),
)
DQ_CANDIDATES = (
    TileConfig(64, 64, 0, num_warps=4, num_stages=3),
    TileConfig(128, 64, 0, num_warps=8, num_stages=2),
    TileConfig(128, 32, 0, num_warps=8, num_stages=3),
    TileConfig(64, 32, 0, num_warps=4, num_stages=3),
)
DKDV_CANDIDATES = (
    TileConfig(32, 64, 0, num_warps=8, num_stages=2),
    TileConfig(32, 64, 0, num_warps=8, num_stages=3),
    TileConfig(64, 64, 0, num_warps=8, num_stages=2),
    TileConfig(64, 64, 0, num_warps=4, num_stages=3),
    TileConfig(32, 64, 0, num_warps=4, num_stages=3),
    TileConfig(32, 128, 0, num_warps=8, num_stages=3),
    TileConfig(64, 128, 0, num_warps=8, num_stages=2),
    TileConfig(64, 32, 0, num_warps=4, num_stages=2),
)


@contextlib.contextmanager
def pinned(ops: tuple[str, ...], configs: tuple[TileConfig, ...]):
    """`configs.PINNED`'s tiles of `ops` on ARCH set to `configs` for the block."""
    keys = [(ARCH, "any", op) for op in ops]
    saved = [cfgs.PINNED[key] for key in keys]
    for key, cfg in zip(keys, configs, strict=True):
        cfgs.PINNED[key] = ((None, cfg),)
    try:
        yield
    finally:
        for key, table in zip(keys, saved, strict=True):
            cfgs.PINNED[key] = table


BACKWARD_OPS = ("invariant_attention_dq", "invariant_attention_dkdv")


def launch_args(variant: str):
    """(mask, causal) of the variant."""
    if variant == "causal":
        return None, True
    tril = torch.ones(T, T, device="cuda", dtype=torch.bool).tril()
    return tril.expand(B, 1, T, T), False


def inputs(seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, device="cuda", generator=g, dtype=torch.bfloat16)

    q, k, v, go = rnd(B, HQ, T, D), rnd(B, HKV, T, D), rnd(B, HKV, T, D), rnd(B, HQ, T, D)
    q_start = torch.zeros(B, dtype=torch.int64, device="cuda")
    kv_len = torch.full((B,), T, dtype=torch.int64, device="cuda")
    return q, k, v, go, q_start, kv_len


def _flat(*ts) -> torch.Tensor:
    return torch.cat([t.reshape(-1).contiguous().view(torch.uint8) for t in ts])


def forward_invariant(ik, q, k, v, out) -> bool:
    """Sequence 0 alone, and decoded at positions across block edges, == its batched rows."""
    one = torch.zeros(1, dtype=torch.int64, device="cuda")
    alone, _ = ik.attention(q[:1], k[:1], v[:1], one, one + T, None, True, D**-0.5)
    ok = count_bytes_differ(alone, out[:1]) == 0
    for t in (0, 63, 64, 200, T - 1):
        pos = one + t
        dec, _ = ik.attention(q[:1, :, t : t + 1], k[:1], v[:1], pos, pos + 1, None, True, D**-0.5)
        ok = ok and count_bytes_differ(dec, out[:1, :, t : t + 1]) == 0
    return ok


def forward_section(rows, variant: str):
    from fp4_compile.codegen.invariant import attention_kernel as ik

    q, k, v, _, qs, kl = inputs()
    mask, causal = launch_args(variant)
    sdpa = bench(
        lambda: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True
        )
    )
    ref = None
    pinned_now = cfgs.pick(ARCH, "any", "invariant_attention", 0)
    for cfg in (pinned_now, *(c for c in FORWARD_CANDIDATES if c != pinned_now)):
        row = {"section": f"forward {variant}", "config": cfg.__dict__.copy(), "baseline_ms": sdpa}
        try:
            with pinned(("invariant_attention",), (cfg,)):

                def run():
                    return ik.attention(q, k, v, qs, kl, mask, causal, D**-0.5)

                out, lse = run()
                row["ms"] = bench(run)
                row["invariant_ok"] = forward_invariant(ik, q, k, v, out)
                if variant != "causal":  # the same pattern as a tensor: the same bits
                    want, _ = ik.attention(q, k, v, qs, kl, None, True, D**-0.5)
                    row["invariant_ok"] &= count_bytes_differ(out, want) == 0
            flat = _flat(out, lse)
            ref = flat if ref is None else ref
            row["differ"] = count_bytes_differ(flat, ref)
        except Exception as exc:  # a config that fails to compile or launch is recorded
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(json.dumps(row), flush=True)
        rows.append(row)


def _backward_sweep(rows, section: str, variants, variant: str):
    from fp4_compile.codegen.invariant import attention_kernel as ik
    from fp4_compile.codegen.invariant.attention_backward_kernel import attention_backward

    q, k, v, go, qs, kl = inputs()
    mask, causal = launch_args(variant)
    q.requires_grad_(True), k.requires_grad_(True), v.requires_grad_(True)

    def sdpa_step():
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True
        )
        torch.autograd.grad(o, (q, k, v), go)

    base = bench(sdpa_step)
    qd, kd, vd = q.detach(), k.detach(), v.detach()
    out, lse = ik.attention(qd, kd, vd, qs, kl, mask, causal, D**-0.5)
    ref = None
    for label, value in variants:
        row = {"section": f"{section} {variant}", "config": label, "baseline_ms": base}
        try:
            with pinned(BACKWARD_OPS, value):

                def run():
                    return attention_backward(
                        go, qd, kd, vd, out, lse, qs, kl, mask, causal, D**-0.5
                    )

                flat = _flat(*run())
                row["ms"] = bench(run)
                row["deterministic"] = count_bytes_differ(_flat(*run()), flat) == 0
            ref = flat if ref is None else ref
            row["differ"] = count_bytes_differ(flat, ref)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
        print(json.dumps(row), flush=True)
        rows.append(row)


def _label(cfg: TileConfig) -> dict:
    return cfg.__dict__.copy()


def _pinned_backward():
    return tuple(cfgs.pick(ARCH, "any", op, 0) for op in BACKWARD_OPS)


def dq_section(rows, variant: str):
    dq, dkdv = _pinned_backward()
    candidates = (dq, *(c for c in DQ_CANDIDATES if c != dq))
    _backward_sweep(rows, "dq", [({"dq": _label(c)}, (c, dkdv)) for c in candidates], variant)


def dkdv_section(rows, variant: str):
    dq, dkdv = _pinned_backward()
    candidates = (dkdv, *(c for c in DKDV_CANDIDATES if c != dkdv))
    _backward_sweep(rows, "dkdv", [({"dkdv": _label(c)}, (dq, c)) for c in candidates], variant)


SECTIONS = {"forward": forward_section, "dq": dq_section, "dkdv": dkdv_section}


def markdown(env, rows) -> str:
    lines = [
        f"# attention config sweep, {env['gpu']}",
        "",
        f"torch {env['torch']}, triton {env['triton']}, commit {env['commit']}, "
        f"{env['date']}. Causal, B={B}, Hq={HQ}, Hkv={HKV}, T={T}, D={D}, bf16. ms = "
        "do_bench median; baseline = SDPA forward (forward rows) or forward + backward "
        "(dq, dkdv rows), same run; first row of each section = the pinned config; "
        "`differ` = output elements whose bits differ from it.",
        "",
        "| section | config | ms | baseline ms | baseline / ms | differ | check |",
        "| --- " * 7 + "|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['section']} | {r['config']} | ERROR {r['error'][:80]} | | | | |")
            continue
        check = (
            f"invariant {r['invariant_ok']}"
            if "invariant_ok" in r
            else f"deterministic {r['deterministic']}"
        )
        lines.append(
            f"| {r['section']} | `{r['config']}` | {r['ms']:.4f} | {r['baseline_ms']:.4f}"
            f" | {r['baseline_ms'] / r['ms']:.2f} | {r['differ']} | {check} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--variants", default="causal,mask", help="comma-separated: causal,mask")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("this tuner needs a CUDA GPU")
    env = environment()
    rows: list = []
    for name in args.only.split(","):
        for variant in args.variants.split(","):
            SECTIONS[name](rows, variant)
            # written after every section: a cut run keeps what it measured
            write_results("tune_attention", {"env": env, "rows": rows}, markdown(env, rows))
    print(markdown(env, rows))


if __name__ == "__main__":
    main()
