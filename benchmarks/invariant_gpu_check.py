"""Batch-invariant ops on the GPU: bitwise invariance checks and timings vs the stock ops.

    python -m benchmarks.invariant_gpu_check [--out DIR]

Checks (each bitwise, the Triton kernels behind fp4_compile::invariant_*): rows of op(x[:m]) ==
rows of op(x) for m up to 256; attention (Qwen3-30B-A3B: 32 q heads, 4 kv heads, head dim 128):
decode against a static cache [B, 4, S_max, 128] at t == the full forward at t across block
boundaries, chunked prefill == one piece, a sequence alone == inside a ragged batch. Timings:
`triton.testing.do_bench` medians against cuBLAS mm, SDPA (flash), F.rms_norm, log_softmax, in
the same run, with the ratio. Writes invariant_gpu_check.{json,md} to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess

import torch
import torch.nn.functional as F

from fp4_compile.codegen.invariant import api as inv
from fp4_compile.testing import count_bytes_differ

HQ, HKV, D, HIDDEN, VOCAB, EXPERTS = 32, 4, 128, 2048, 151936, 128
ROWS = (1, 2, 3, 7, 16, 64, 129, 256)


def _commit() -> str:
    if os.environ.get("MINITE_COMMIT"):
        return os.environ["MINITE_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True).strip()
    except Exception:
        return "unknown"


def _rows_invariant(fn, x, name, results):
    full = fn(x)
    worst = 0
    for m in ROWS:
        part = fn(x[:m])
        outs = part if isinstance(part, tuple) else (part,)
        fulls = full if isinstance(full, tuple) else (full,)
        worst = max(worst, *(count_bytes_differ(a, b[:m]) for a, b in zip(outs, fulls)))
    results.append({"check": f"{name}: rows of op(x[:m]) == op(x), m in {list(ROWS)}",
                    "differing_elements": worst, "ok": worst == 0})  # fmt: skip


def checks(dev) -> list[dict]:
    g = torch.Generator(device=dev).manual_seed(0)
    rnd = lambda *s: torch.randn(*s, device=dev, generator=g)  # noqa: E731
    res: list[dict] = []
    x = rnd(256, HIDDEN).bfloat16()
    for name, n in (("linear q_proj", 4096), ("linear router", EXPERTS), ("linear lm_head", VOCAB)):
        w = (rnd(n, HIDDEN) * 0.02).bfloat16()
        _rows_invariant(lambda a, w=w: inv.linear(a, w, out_dtype=torch.float32), x, name, res)
    w = rnd(HIDDEN).bfloat16()
    _rows_invariant(lambda a: inv.rms_norm(a, w, 1e-6), x, "rms_norm H=2048", res)
    _rows_invariant(lambda a: inv.rms_norm(a, w, 1e-6, residual=a * 0.5), x, "add_rms_norm", res)
    logits = (rnd(256, VOCAB) * 3).bfloat16()
    tokens = torch.randint(0, VOCAB, (256,), device=dev, generator=g)
    res_lp = []
    _rows_invariant(
        lambda a: inv.logprobs(a, tokens[: a.shape[0]], 0.7), logits, "logprobs V=151936", res_lp
    )
    res += res_lp
    lp, _ = inv.logprobs(logits, tokens, 0.7)
    ref = torch.log_softmax(logits.double() / 0.7, -1).gather(-1, tokens[:, None])[:, 0]
    res.append({"check": "logprobs max |err| vs float64", "value": float((lp.double() - ref).abs().max()),
                "ok": bool((lp.double() - ref).abs().max() < 1e-4)})  # fmt: skip
    router_logits = inv.linear(x, (rnd(EXPERTS, HIDDEN) * 0.02).bfloat16())
    _rows_invariant(lambda a: inv.route(a, 8), router_logits, "routing E=128 k=8", res)
    from fp4_compile.codegen.invariant import reference as invariant_cpu

    w_gpu, i_gpu = inv.route(router_logits, 8)
    w_cpu, i_cpu = invariant_cpu.routing(router_logits.cpu(), 8, True)
    err = float((w_gpu.cpu() - w_cpu).abs().max())
    res.append({"check": "routing kernel vs CPU construction: same experts, max |dw|",
                "value": f"{int((i_gpu.cpu() != i_cpu).sum())} experts differ, {err:.2g}",
                "ok": bool(torch.equal(i_gpu.cpu(), i_cpu) and err <= 2e-6)})  # fmt: skip

    # attention, Qwen3-30B-A3B shapes
    b, t, s_max = 2, 1024, 2048
    q, k, v = (rnd(b, h, t, D).bfloat16() for h in (HQ, HKV, HKV))
    full = inv.attention(q, k, v)
    oracle = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True
    )
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    res.append({"check": "attention max |err| vs float64 (SDPA bf16 in brackets)",
                "value": f"{float((full.double() - oracle).abs().max()):.3g} ({float((sdpa.double() - oracle).abs().max()):.3g})",
                "ok": bool((full.double() - oracle).abs().max() <= 2 * (sdpa.double() - oracle).abs().max())})  # fmt: skip
    kc = torch.zeros(b, HKV, s_max, D, device=dev, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    kc[:, :, :t], vc[:, :, :t] = k, v
    worst = 0
    for pos in (0, 1, 63, 64, 65, 127, 128, 511, 777, 1023):
        dec = inv.attention(q[:, :, pos : pos + 1], kc, vc, q_start=pos, kv_len=pos + 1)
        worst = max(worst, count_bytes_differ(dec, full[:, :, pos : pos + 1]))
    res.append(
        {
            "check": "attention decode (cache S_max=2048) == full forward at t",
            "differing_elements": worst,
            "ok": worst == 0,
        }
    )
    worst, start = 0, 0
    for n in (100, 412, 512):
        part = inv.attention(q[:, :, start : start + n], k, v, q_start=start, kv_len=start + n)
        worst = max(worst, count_bytes_differ(part, full[:, :, start : start + n]))
        start += n
    res.append(
        {
            "check": "attention chunked prefill (100, 412, 512) == one piece",
            "differing_elements": worst,
            "ok": worst == 0,
        }
    )
    lens = torch.tensor([1024, 300, 77, 1000, 5, 640, 1024, 333], device=dev)
    qb, kb, vb = (rnd(8, h, t, D).bfloat16() for h in (HQ, HKV, HKV))
    qb[0], kb[0], vb[0] = q[0], k[0], v[0]
    batch_out = inv.attention(qb, kb, vb, kv_len=lens)
    worst = count_bytes_differ(batch_out[:1], full[:1])
    for i in (1, 2, 4):
        n = int(lens[i])
        alone = inv.attention(qb[i : i + 1, :, :n], kb[i : i + 1, :, :n], vb[i : i + 1, :, :n])
        worst = max(worst, count_bytes_differ(batch_out[i : i + 1, :, :n], alone))
    res.append(
        {
            "check": "attention: sequence alone == inside ragged batch of 8",
            "differing_elements": worst,
            "ok": worst == 0,
        }
    )
    return res


def timings(dev) -> list[dict]:
    from triton.testing import do_bench

    g = torch.Generator(device=dev).manual_seed(1)
    rnd = lambda *s: torch.randn(*s, device=dev, generator=g)  # noqa: E731
    rows = []

    def bench(name, ours, base, base_name, bytes_moved=None):
        t_ours, t_base = do_bench(ours), do_bench(base)
        row = {"op": name, "ours_ms": t_ours, "baseline": base_name, "baseline_ms": t_base,
               "speed_ratio": t_base / t_ours}  # fmt: skip
        if bytes_moved:
            row["ours_TBps"] = bytes_moved / t_ours / 1e9
        rows.append(row)

    n = 8192
    a, bm = rnd(n, n).bfloat16(), rnd(n, n).bfloat16()
    bench("mm 8192^3 bf16", lambda: inv.linear(a, bm), lambda: a @ bm.t(), "cuBLAS mm")
    a16 = rnd(16, n).bfloat16()
    bench("mm M=16 N=K=8192", lambda: inv.linear(a16, bm), lambda: a16 @ bm.t(), "cuBLAS mm")
    x = rnd(16384, HIDDEN).bfloat16()
    w = rnd(HIDDEN).bfloat16()
    bench("rms_norm [16384, 2048]", lambda: inv.rms_norm(x, w, 1e-6),
          lambda: F.rms_norm(x, (HIDDEN,), w, 1e-6), "F.rms_norm", 2 * x.numel() * 2)  # fmt: skip
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
    bench("logprobs [2048, 151936]", lambda: inv.logprobs(logits, tok, 0.7),
          lambda: torch.log_softmax(logits.float() / 0.7, -1).gather(-1, tok[:, None]),
          "log_softmax(fp32)+gather", logits.numel() * 2 * 2)  # fmt: skip
    bsz, ctx = 64, 2048
    q = rnd(bsz, HQ, 1, D).bfloat16()
    kc, vc = rnd(bsz, HKV, ctx, D).bfloat16(), rnd(bsz, HKV, ctx, D).bfloat16()
    pos = torch.full((bsz,), ctx - 1, device=dev)
    bench("attention decode B=64 ctx=2048", lambda: inv.attention(q, kc, vc, q_start=pos, kv_len=pos + 1),
          lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True), "SDPA (enable_gqa)",
          2 * kc.numel() * 2)  # fmt: skip
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
    bench("attention prefill B=2 T=4096 causal", lambda: inv.attention(q, k, v),
          lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True), "SDPA flash (kv repeated)")  # fmt: skip
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    import triton

    dev = torch.device("cuda")
    env = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version(), "commit": _commit()}  # fmt: skip
    print(json.dumps(env))
    res = checks(dev)
    for r in res:
        print(("PASS " if r["ok"] else "FAIL ") + json.dumps(r))
    rows = timings(dev)
    for r in rows:
        print(json.dumps(r))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "invariant_gpu_check.json"), "w") as f:
        json.dump({"env": env, "checks": res, "timings": rows}, f, indent=1)
    md = [
        "# Batch-invariant ops on the GPU",
        "",
        "`" + json.dumps(env) + "`",
        "",
        "## Bitwise checks",
        "",
    ]
    md += [f"- {'PASS' if r['ok'] else 'FAIL'}: {r['check']} "
           f"({r.get('differing_elements', r.get('value'))})" for r in res]  # fmt: skip
    md += ["", "## Timings (do_bench median, ms; ratio = baseline / ours, > 1 is faster)", "",
           "| op | ours | baseline | baseline ms | ratio | TB/s |", "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        md.append(f"| {r['op']} | {r['ours_ms']:.4f} | {r.get('baseline', '')} | "
                  f"{r.get('baseline_ms', float('nan')):.4f} | {r.get('speed_ratio', float('nan')):.2f} | "
                  f"{r.get('ours_TBps', float('nan')):.2f} |")  # fmt: skip
    with open(os.path.join(args.out, "invariant_gpu_check.md"), "w") as f:
        f.write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
