"""Batch-invariant ops against the stock ops they replace, on the GPU, in the same run.

    python -m benchmarks.invariant

`triton.testing.do_bench` medians (ms) of the Triton kernels behind `fp4_compile::invariant_*`
against cuBLAS mm, SDPA (flash), F.rms_norm and log_softmax, with the ratio (baseline / ours,
> 1 is faster) and bandwidth where the op is memory-bound; Qwen3-30B-A3B shapes (hidden 2048,
32 query / 4 key-value heads of 128, vocab 151936). Their bitwise contracts are tests:
tests/gpu/test_gpu_invariant_ops.py.
"""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from benchmarks.common import environment, write_results
from fp4_compile import codegen

HQ, HKV, D, HIDDEN, VOCAB = 32, 4, 128, 2048, 151936


def timings(dev) -> list[dict]:
    from triton.testing import do_bench

    g = torch.Generator(device=dev).manual_seed(1)
    rnd = lambda *s: torch.randn(*s, device=dev, generator=g)  # noqa: E731
    rows = []

    def bench(name, ours, base, base_name, bytes_moved=None):
        t_ours, t_base = do_bench(ours), do_bench(base)
        row = {
            "op": name,
            "ours_ms": t_ours,
            "baseline": base_name,
            "baseline_ms": t_base,
            "speed_ratio": t_base / t_ours,
        }
        if bytes_moved:
            row["ours_TBps"] = bytes_moved / t_ours / 1e9
        rows.append(row)

    n = 8192
    a, bm = rnd(n, n).bfloat16(), rnd(n, n).bfloat16()
    bench("mm 8192^3 bf16", lambda: codegen.linear(a, bm), lambda: a @ bm.t(), "cuBLAS mm")
    a16 = rnd(16, n).bfloat16()
    bench("mm M=16 N=K=8192", lambda: codegen.linear(a16, bm), lambda: a16 @ bm.t(), "cuBLAS mm")
    x = rnd(16384, HIDDEN).bfloat16()
    w = rnd(HIDDEN).bfloat16()
    bench(
        "rms_norm [16384, 2048]",
        lambda: codegen.rms_norm(x, w, 1e-6),
        lambda: F.rms_norm(x, (HIDDEN,), w, 1e-6),
        "F.rms_norm",
        2 * x.numel() * 2,
    )
    copy_ms = do_bench(lambda: x.clone())
    rows.append(
        {
            "op": "copy [16384, 2048] bf16",
            "ours_ms": copy_ms,
            "ours_TBps": 2 * x.numel() * 2 / copy_ms / 1e9,
        }
    )
    logits = rnd(2048, VOCAB).bfloat16()
    tok = torch.randint(0, VOCAB, (2048,), device=dev)
    bench(
        "logprobs [2048, 151936]",
        lambda: codegen.logprobs(logits, tok, 0.7),
        lambda: torch.log_softmax(logits.float() / 0.7, -1).gather(-1, tok[:, None]),
        "log_softmax(fp32)+gather",
        logits.numel() * 2 * 2,
    )
    bsz, ctx = 64, 2048
    q = rnd(bsz, HQ, 1, D).bfloat16()
    kc, vc = rnd(bsz, HKV, ctx, D).bfloat16(), rnd(bsz, HKV, ctx, D).bfloat16()
    pos = torch.full((bsz,), ctx - 1, device=dev)
    bench(
        "attention decode B=64 ctx=2048",
        lambda: codegen.attention(q, kc, vc, q_start=pos, kv_len=pos + 1),
        lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True),
        "SDPA (enable_gqa)",
        2 * kc.numel() * 2,
    )
    kr, vr = kc.repeat_interleave(8, 1), vc.repeat_interleave(8, 1)
    rows[-1]["baseline_flash_repeated_kv_ms"] = do_bench(
        lambda: F.scaled_dot_product_attention(q, kr, vr)
    )
    t = 4096
    q, k, v = (
        rnd(2, HQ, t, D).bfloat16(),
        rnd(2, HKV, t, D).bfloat16(),
        rnd(2, HKV, t, D).bfloat16(),
    )
    kr, vr = k.repeat_interleave(8, 1), v.repeat_interleave(8, 1)
    bench(
        "attention prefill B=2 T=4096 causal",
        lambda: codegen.attention(q, k, v),
        lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True),
        "SDPA flash (kv repeated)",
    )
    return rows


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA GPU")
    env = environment()
    rows = timings(torch.device("cuda"))
    for r in rows:
        print(json.dumps(r), flush=True)
    md = [
        f"# Batch-invariant ops vs the stock ops, {env['gpu']}, torch {env['torch']}, "
        f"triton {env['triton']}, commit {env['commit']}",
        "",
        "do_bench median, ms; ratio = baseline / ours, > 1 is faster",
        "",
        "| op | ours | baseline | baseline ms | ratio | TB/s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        md.append(
            f"| {r['op']} | {r['ours_ms']:.4f} | {r.get('baseline', '')} | "
            f"{r.get('baseline_ms', float('nan')):.4f} | {r.get('speed_ratio', float('nan')):.2f} | "
            f"{r.get('ours_TBps', float('nan')):.2f} |"
        )
    text = "\n".join(md) + "\n"
    print(text)
    for path in write_results("invariant", {"env": env, "rows": rows}, text):
        print("wrote", path)


if __name__ == "__main__":
    main()
