# ruff: noqa: B023  (each benchmarked closure is timed immediately, inside its own iteration)
"""NVFP4 ops on the GPU: correctness checks, then speed against BF16 baselines measured here.

    python -m benchmarks.nvfp4_gpu_check [--out DIR] [--quick]

Checks (each asserted, results recorded): quantize kernel bitwise == reference (all modes,
stochastic, per-expert); W4A4 GEMM vs the exact reference within the FP32 accumulation budget
|y - y_ref| <= K * 2**-24 * (|a| @ |b|) * |gd_a gd_b| + 4 * 2**-24 * |y_ref|; packed weights ==
on-grid BF16 weights bitwise; grouped == per-expert loop bitwise; batch invariance (row i of
op(x[:m]) == row i of op(x) for m in {1,2,3,7,16,64,129,256}, crossing every pinned M bucket);
gradients vs the CPU (exact) path within budget.

Speed: `triton.testing.do_bench` medians at Qwen3-30B-A3B shapes (hidden 2048, q 4096, kv 512,
128 experts, top-8, moe_intermediate 768) and the issue's square shapes; baselines (cuBLAS BF16
F.linear, torch._grouped_mm BF16, device copy) measured in the same run. Figures are
"emulated NVFP4 (sm_90)": Hopper has no FP4 tensor cores, operands are dequantized to BF16.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time

import torch
import torch.nn.functional as F

from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.codegen import nvfp4_impl as impl
from fp4_compile.testing import count_bytes_differ

LABEL = "emulated NVFP4 (sm_90)"
BATCH_SIZES = (1, 2, 3, 7, 16, 64, 129, 256)
U = 2.0**-24


def _commit() -> str:
    env = os.environ.get("GIT_COMMIT")
    if env:
        return env
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True).strip()
    except Exception:
        return "unknown"


def _x(*shape, dtype=torch.bfloat16, seed=0, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.logspace(-3, 1, shape[-1])
    return x.to(dtype).to(device)


class Checks:
    def __init__(self):
        self.rows = []

    def add(self, name, ok, detail=""):
        self.rows.append({"check": name, "ok": bool(ok), "detail": str(detail)})
        print(f"[{'PASS' if ok else 'FAIL'}] {name} {detail}", flush=True)


def _nv_equal(a, b):
    return (count_bytes_differ(a.codes, b.codes), count_bytes_differ(
        a.block_scales.view(torch.uint8), b.block_scales.view(torch.uint8)),
        count_bytes_differ(a.global_decode, b.global_decode))  # fmt: skip


def check_quantize(c: Checks):
    from fp4_compile.codegen.quantize_kernel import quantize_triton

    x = _x(512, 2048)
    for block, gs in [("1x16", "per_row"), ("1x16", "per_tensor"), ("16x16", "per_tensor"),
                      ("1x16", torch.tensor(3.0)), ("16x16", torch.tensor(1e-3))]:  # fmt: skip
        gsd = gs.cuda() if isinstance(gs, torch.Tensor) else gs
        got = quantize_triton(x, block=block, global_scale=gsd)
        want_cpu = ref.quantize(x.cpu(), block=block, global_scale=gs)
        want_gpu = ref.quantize(x, block=block, global_scale=gsd)
        d1 = _nv_equal(got.to("cpu"), want_cpu)
        d2 = _nv_equal(got, want_gpu)
        og, _ = quantize_triton(x, block=block, global_scale=gsd, out="ongrid")
        d3 = count_bytes_differ(og.cpu(), want_cpu.on_grid(torch.bfloat16))
        name = gs if isinstance(gs, str) else f"static({float(gs)})"
        c.add(f"quantize {block} {name} == reference (cpu, cuda, on-grid)",
              sum(d1) + sum(d2) + d3 == 0, f"differ cpu={d1} cuda={d2} ongrid={d3}")  # fmt: skip
    xf = _x(256, 1024, dtype=torch.float32)
    got = quantize_triton(xf, global_scale="per_tensor", rounding="stochastic", seed=7)
    d = _nv_equal(got.to("cpu"), ref.quantize(xf.cpu(), global_scale="per_tensor",
                                              rounding="stochastic", seed=7))  # fmt: skip
    c.add("quantize stochastic (seed 7) == reference", sum(d) == 0, f"differ={d}")
    w = _x(8, 256, 512)
    d = _nv_equal(quantize_triton(w, block="16x16", global_scale="per_expert").to("cpu"),
                  ref.quantize_experts(w.cpu()))  # fmt: skip
    c.add("quantize per-expert 16x16 == quantize_experts", sum(d) == 0, f"differ={d}")


def _wargs(wq, ongrid=None):
    return (wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode, ongrid)


def check_gemm(c: Checks, recipe):
    m, n, k = 256, 1024, 2048
    x, w = _x(m, k, seed=1), _x(n, k, dtype=torch.float32, seed=2)
    bias = _x(n, dtype=torch.bfloat16, seed=3)
    wq = ref.quantize(w, block="16x16")
    y = impl.cuda_linear(x, *_wargs(wq), bias, recipe, None)
    y32 = impl.cuda_linear(x.float(), *_wargs(wq), bias, recipe, None)
    xq = ref.quantize(x.float().cpu(), global_scale="per_row")
    wq_cpu = wq.to("cpu")
    y_ref = ref.nvfp4_mm(xq, wq_cpu) + bias.float().cpu()
    a, b = xq.on_grid(torch.float64), wq_cpu.on_grid(torch.float64)
    gd = (xq.global_decode.double() * wq_cpu.global_decode.double()).abs()
    budget = (a.abs() @ b.abs().t()) * gd * (k * U) + 4 * U * y_ref.double().abs()
    err = (y32.cpu().double() - y_ref.double()).abs()
    c.add("GEMM fp32-out vs exact reference within K*u budget", bool((err <= budget).all()),
          f"max err {float(err.max()):.3e}, max err/budget {float((err / budget).max()):.3e}, "
          f"bitwise-equal elements {int((err == 0).sum())}/{err.numel()}")  # fmt: skip
    y_ref_bf16 = y_ref.to(torch.bfloat16)
    c.add(
        "GEMM bf16-out vs exact reference (bf16 of it), elements differing",
        True,
        f"{count_bytes_differ(y.cpu(), y_ref_bf16)}/{y.numel()} (each <= 1 bf16 ulp expected)",
    )
    y_og = impl.cuda_linear(x, *_wargs(wq, wq.on_grid(torch.bfloat16)), bias, recipe, None)
    c.add("GEMM packed weights == on-grid BF16 weights (bitwise)", count_bytes_differ(y_og, y) == 0,
          f"differ={count_bytes_differ(y_og, y)}")  # fmt: skip
    # batch invariance across the pinned M buckets, rows at several positions
    xb = _x(512, k, seed=4)
    for label, og in (("packed", None), ("on-grid", wq.on_grid(torch.bfloat16))):
        full = impl.cuda_linear(xb[100:], *_wargs(wq, og), bias, recipe, None)
        bad = []
        for m_ in BATCH_SIZES:
            part = impl.cuda_linear(xb[100 : 100 + m_], *_wargs(wq, og), bias, recipe, None)
            if count_bytes_differ(part, full[:m_]):
                bad.append(m_)
        shifted = impl.cuda_linear(xb, *_wargs(wq, og), bias, recipe, None)[100:]
        c.add(f"batch invariance linear ({label} weights), m in {BATCH_SIZES}",
              not bad and count_bytes_differ(shifted, full) == 0, f"failing m={bad}")  # fmt: skip


def check_grouped(c: Checks, recipe):
    for name, (e, n, k) in {"gate_up": (8, 1536, 2048), "down": (8, 2048, 768)}.items():
        w = _x(e, n, k, dtype=torch.float32, seed=5)
        wq = ref.quantize_experts(w)
        counts = [3, 0, 17, 64, 1, 130, 0, 41]
        offsets = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32).cuda()
        t = int(offsets[-1])
        x = _x(t, k, seed=6)
        for label, og in (("packed", None), ("on-grid", wq.on_grid(torch.bfloat16))):
            y = impl.cuda_linear(x, *_wargs(wq, og), None, recipe, None, offsets=offsets)
            diff, start = 0, 0
            for i, end in enumerate(offsets.tolist()):
                if end > start:
                    ogi = None if og is None else og[i]
                    want = impl.cuda_linear(x[start:end], wq.codes[i], wq.block_scales[i].view(torch.uint8),
                                            wq.global_decode[i].reshape(()), ogi, None, recipe, None)  # fmt: skip
                    diff += count_bytes_differ(y[start:end], want)
                start = end
            c.add(f"grouped {name} ({label}) == per-expert linear loop (bitwise)", diff == 0,
                  f"differ={diff}")  # fmt: skip


def check_grads(c: Checks, recipe):
    m, n, k = 256, 512, 1024
    x, w = _x(m, k, dtype=torch.float32, seed=7), _x(n, k, dtype=torch.float32, seed=8)
    dy = _x(m, n, dtype=torch.float32, seed=9)
    wq = ref.quantize(w, block="16x16")
    dx = impl.cuda_dgrad(dy, *_wargs(wq), w, recipe, 5).cpu()
    dx_ref = impl.cpu_dgrad(dy.cpu(), wq.to("cpu"), w.cpu(), recipe, 5)
    bound = (dy.abs() @ w.abs()).cpu() * (4 * n * U)
    c.add("dgrad (NVFP4, SR) vs exact CPU path within budget", bool(((dx - dx_ref).abs() <= bound).all()),
          f"max rel {float(((dx - dx_ref).abs() / (bound + 1e-30)).max()):.3e} of budget")  # fmt: skip
    dw = impl.cuda_wgrad(dy, x, recipe, 6).cpu()
    dw_ref = impl.cpu_wgrad(dy.cpu(), x.cpu(), recipe, 6)
    bound = (dy.abs().t() @ x.abs()).cpu() * (4 * m * U)
    c.add("wgrad (NVFP4, SR) vs exact CPU path within budget", bool(((dw - dw_ref).abs() <= bound).all()),
          f"max rel {float(((dw - dw_ref).abs() / (bound + 1e-30)).max()):.3e} of budget")  # fmt: skip
    # the full autograd op on CUDA
    xx = x.to(torch.bfloat16).requires_grad_()
    ww = w.clone().requires_grad_()
    from fp4_compile.codegen import nvfp4_linear

    nvfp4_linear(xx, ww, recipe=recipe).float().backward(dy)
    c.add("autograd op on CUDA runs (dx, dW finite)",
          bool(torch.isfinite(xx.grad).all() and torch.isfinite(ww.grad).all()), "")  # fmt: skip


def _bench(fn):
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def bench(recipe, quick: bool):
    from fp4_compile.codegen.nvfp4_gemm import launch_gemm
    from fp4_compile.codegen.quantize_kernel import quantize_triton

    rows = []
    linear_shapes = [("q_proj", 4096, 2048), ("kv_proj", 512, 2048), ("o_proj", 2048, 4096)]
    ms = (16, 64, 256, 4096)
    square = [("square_8192_decode", 16, 8192, 8192), ("square_4096", 4096, 4096, 4096),
              ("square_8192", 8192, 8192, 8192)]  # fmt: skip
    cases = [(name, m, n, k) for name, n, k in linear_shapes for m in ms] + square
    if quick:
        cases = cases[:2]
    for name, m, n, k in cases:
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        wq = quantize_triton(w, block="16x16", global_scale="per_tensor")
        w_og = wq.on_grid(torch.bfloat16)
        a, gd_a = quantize_triton(x, global_scale="per_row", out="ongrid")
        codes, sc = wq.codes, wq.block_scales.view(torch.uint8)
        t_bf16 = _bench(lambda: F.linear(x, w))
        t_gemm_packed = _bench(
            lambda: launch_gemm(a, gd_a, (codes, sc), wq.global_decode, out_dtype=torch.bfloat16)
        )
        t_gemm_og = _bench(
            lambda: launch_gemm(a, gd_a, w_og, wq.global_decode, out_dtype=torch.bfloat16)
        )
        t_op = _bench(
            lambda: impl.cuda_linear(x, codes, sc, wq.global_decode, None, None, recipe, None)
        )
        t_op_og = _bench(
            lambda: impl.cuda_linear(x, codes, sc, wq.global_decode, w_og, None, recipe, None)
        )
        flops = 2.0 * m * n * k
        row = {"kind": "linear", "name": name, "M": m, "N": n, "K": k, "bf16_ms": t_bf16,
               "w4a4_op_packed_ms": t_op, "w4a4_op_ongrid_ms": t_op_og,
               "gemm_packed_ms": t_gemm_packed, "gemm_ongrid_ms": t_gemm_og,
               "bf16_tflops": flops / t_bf16 / 1e9,
               "ratio_op_packed": t_bf16 / t_op, "ratio_op_ongrid": t_bf16 / t_op_og,
               "ratio_gemm_packed": t_bf16 / t_gemm_packed, "ratio_gemm_ongrid": t_bf16 / t_gemm_og}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    # grouped: Qwen3-30B-A3B experts, top-8, balanced routing
    for name, (e, n, k) in {
        "experts_gate_up": (128, 1536, 2048),
        "experts_down": (128, 2048, 768),
    }.items():
        if quick and name == "experts_down":
            break
        w = torch.randn(e, n, k, device="cuda", dtype=torch.bfloat16)
        wq = quantize_triton(w, block="16x16", global_scale="per_expert")
        w_og = wq.on_grid(torch.bfloat16)
        codes, sc = wq.codes, wq.block_scales.view(torch.uint8)
        for tokens in (16, 64, 256, 4096):
            t = tokens * 8
            per = t // e
            offsets = (torch.arange(1, e + 1, device="cuda", dtype=torch.int32) * per).to(
                torch.int32
            )
            x = torch.randn(t, k, device="cuda", dtype=torch.bfloat16)
            w_kn = w.transpose(-1, -2)  # [E, K, N] view, as torch._grouped_mm takes it
            try:
                t_base = _bench(lambda: torch._grouped_mm(x, w_kn, offs=offsets))
                base = "torch._grouped_mm bf16"
            except Exception as exc:  # older torch: per-expert loop baseline
                print("grouped_mm baseline unavailable:", exc)
                t_base = _bench(
                    lambda: [F.linear(x[i * per : (i + 1) * per], w[i]) for i in range(e)]
                )
                base = "per-expert F.linear loop bf16"
            t_op = _bench(
                lambda: impl.cuda_linear(
                    x, codes, sc, wq.global_decode, None, None, recipe, None, offsets=offsets
                )
            )
            t_op_og = _bench(
                lambda: impl.cuda_linear(
                    x, codes, sc, wq.global_decode, w_og, None, recipe, None, offsets=offsets
                )
            )
            row = {"kind": "grouped", "name": name, "tokens": tokens, "T": t, "tokens_per_expert": per,
                   "E": e, "N": n, "K": k, "baseline": base, "baseline_ms": t_base,
                   "w4a4_op_packed_ms": t_op, "w4a4_op_ongrid_ms": t_op_og,
                   "ratio_op_packed": t_base / t_op, "ratio_op_ongrid": t_base / t_op_og}  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    # quantize vs copy bandwidth
    for m, k in ((4096, 2048), (32768, 2048)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        t_copy = _bench(lambda: x.clone())
        t_q = _bench(lambda: quantize_triton(x, global_scale="per_row"))
        t_og = _bench(lambda: quantize_triton(x, global_scale="per_row", out="ongrid"))
        copy_gbs = 2 * x.numel() * 2 / t_copy / 1e6
        q_bytes = x.numel() * (2 + 0.5 + 1 / 16)
        row = {"kind": "quantize", "M": m, "K": k, "copy_ms": t_copy, "copy_GBps": copy_gbs,
               "quantize_packed_ms": t_q, "quantize_packed_GBps": q_bytes / t_q / 1e6,
               "quantize_ongrid_ms": t_og, "fraction_of_copy_bw": (q_bytes / t_q / 1e6) / copy_gbs}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def _markdown(meta, checks, rows) -> str:
    out = [f"# NVFP4 ops on {meta['gpu']} ({LABEL})", "",
           f"torch {meta['torch']}, triton {meta['triton']}, commit {meta['commit']}, {meta['date']}", "",
           "## Checks", "", "| check | result | detail |", "| --- | --- | --- |"]  # fmt: skip
    out += [f"| {r['check']} | {'PASS' if r['ok'] else 'FAIL'} | {r['detail']} |" for r in checks]
    out += ["", "## Linear (ms, median; ratio = BF16 time / ours, >1 is faster)", "",
            "| layer | M | N | K | cuBLAS BF16 | op packed | op on-grid | GEMM packed | GEMM on-grid | ratio op packed | ratio op on-grid |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        if r["kind"] == "linear":
            out.append(f"| {r['name']} | {r['M']} | {r['N']} | {r['K']} | {r['bf16_ms']:.4f} | "
                       f"{r['w4a4_op_packed_ms']:.4f} | {r['w4a4_op_ongrid_ms']:.4f} | {r['gemm_packed_ms']:.4f} | "
                       f"{r['gemm_ongrid_ms']:.4f} | {r['ratio_op_packed']:.2f} | {r['ratio_op_ongrid']:.2f} |")  # fmt: skip
    out += ["", "## Grouped (MoE experts, balanced top-8 routing)", "",
            "| weights | tokens | tokens/expert | baseline | baseline ms | op packed ms | op on-grid ms | ratio packed | ratio on-grid |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        if r["kind"] == "grouped":
            out.append(f"| {r['name']} [{r['E']},{r['N']},{r['K']}] | {r['tokens']} | {r['tokens_per_expert']} | "
                       f"{r['baseline']} | {r['baseline_ms']:.4f} | {r['w4a4_op_packed_ms']:.4f} | "
                       f"{r['w4a4_op_ongrid_ms']:.4f} | {r['ratio_op_packed']:.2f} | {r['ratio_op_ongrid']:.2f} |")  # fmt: skip
    out += [
        "",
        "## Quantize (per-row, 1x16, packed) vs device copy",
        "",
        "| M | K | copy GB/s | quantize GB/s | fraction of copy |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if r["kind"] == "quantize":
            out.append(f"| {r['M']} | {r['K']} | {r['copy_GBps']:.0f} | {r['quantize_packed_GBps']:.0f} | "
                       f"{r['fraction_of_copy_bw']:.2f} |")  # fmt: skip
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--quick", action="store_true", help="few benchmark shapes")
    parser.add_argument("--no-bench", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("this script needs a CUDA GPU")
    import triton

    meta = {"gpu": torch.cuda.get_device_name(), "capability": list(torch.cuda.get_device_capability()),
            "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "commit": _commit(), "date": time.strftime("%Y-%m-%d %H:%M:%S"), "label": LABEL}  # fmt: skip
    print(json.dumps(meta), flush=True)
    recipe = NVFP4Recipe.strict()
    checks = Checks()
    for fn in (check_quantize, lambda c: check_gemm(c, recipe), lambda c: check_grouped(c, recipe),
               lambda c: check_grads(c, recipe)):  # fmt: skip
        try:
            fn(checks)
        except Exception as exc:  # record and go on: the report must say what broke
            import traceback

            traceback.print_exc()
            checks.add(f"check raised {type(exc).__name__}", False, str(exc)[:300])
    rows = [] if args.no_bench else bench(recipe, args.quick)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "nvfp4_gpu_check.json"), "w") as f:
        json.dump({"meta": meta, "checks": checks.rows, "benchmarks": rows}, f, indent=1)
    with open(os.path.join(args.out, "nvfp4_gpu_check.md"), "w") as f:
        f.write(_markdown(meta, checks.rows, rows))
    print(f"checks: {sum(r['ok'] for r in checks.rows)}/{len(checks.rows)} passed")


if __name__ == "__main__":
    main()
