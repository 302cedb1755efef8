"""NVFP4 ops on the GPU: correctness checks (bitwise where the contract says so), recorded.

    python -m benchmarks.nvfp4_gpu_check [--out DIR]

Checks (each asserted, results recorded): quantize kernel bitwise == reference (all modes,
stochastic, per-expert); W4A4 GEMM vs the exact reference within the FP32 accumulation budget
|y - y_ref| <= K * 2**-24 * (|a| @ |b|) * |gd_a gd_b| + 4 * 2**-24 * |y_ref|; packed weights ==
on-grid BF16 weights bitwise; grouped == per-expert loop bitwise; batch invariance (row i of
op(x[:m]) == row i of op(x) for m in {1,2,3,7,16,64,129,256}, crossing every pinned M bucket);
gradients vs the CPU (exact) path within budget.

Speed lives in `benchmarks.gemm`, `benchmarks.grouped_gemm` and `benchmarks.quantize`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time

import torch

from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.codegen.nvfp4 import gemm as impl
from fp4_compile.testing import count_bytes_differ

LABEL = "emulated NVFP4 (sm_90)"
BATCH_SIZES = (1, 2, 3, 7, 16, 64, 129, 256)
U = 2.0**-24


def _commit() -> str:
    env = os.environ.get("MINITE_COMMIT") or os.environ.get("GIT_COMMIT")
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
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

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
    # the SR stream drawn in the kernel's registers, at a call seed's size (63 bits), per row
    seed = 2**62 + 3 * 4096 + 1
    xb = _x(384, 2048, seed=13)
    got = quantize_triton(xb, global_scale="per_row", rounding="stochastic", seed=seed)
    d = _nv_equal(got.to("cpu"), ref.quantize(xb.cpu(), global_scale="per_row",
                                              rounding="stochastic", seed=seed))  # fmt: skip
    c.add("quantize stochastic in-kernel stream, 63-bit seed, per_row == CPU reference",
          sum(d) == 0, f"differ={d}")  # fmt: skip
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


def check_grouped_wgrad(c: Checks, recipe):
    """The one-pass MoE wgrad == the per-expert loop of dense wgrads (bitwise), and vs the CPU
    (exact) path within the FP32 accumulation budget."""
    from fp4_compile.codegen.nvfp4.grouped_wgrad_kernel import grouped_wgrad

    counts = [3, 0, 17, 64, 1, 130, 0, 41]
    offsets = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32).cuda()
    t, seed = int(offsets[-1]), 2**40 + 8192
    for name, (n, k) in {"gate_up": (1536, 2048), "down": (2048, 768)}.items():
        dy, x = _x(t, n, seed=14), _x(t, k, seed=15)
        dw = grouped_wgrad(dy, x, offsets, recipe, seed)
        diff, over, start = 0, 0, 0
        for i, end in enumerate(offsets.tolist()):
            if end > start:
                want = impl.cuda_wgrad(dy[start:end], x[start:end], recipe, seed + 1 + i)
                diff += count_bytes_differ(dw[i], want)
                cpu = impl.cpu_wgrad(dy[start:end].cpu(), x[start:end].cpu(), recipe, seed + 1 + i)
                m = -(-(end - start) // 16) * 16
                bound = (dy[start:end].abs().float().t() @ x[start:end].abs().float()).cpu()
                over += int(((dw[i].cpu() - cpu).abs() > bound * (4 * m * U)).sum())
            else:
                diff += int((dw[i] != 0).sum())
            start = end
        c.add(f"grouped wgrad {name} (one pass) == per-expert loop (bitwise)", diff == 0,
              f"differ={diff}")  # fmt: skip
        c.add(f"grouped wgrad {name} vs exact CPU path within budget", over == 0,
              f"elements over budget={over}")  # fmt: skip


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


def _markdown(meta, checks) -> str:
    out = [f"# NVFP4 ops on {meta['gpu']} ({LABEL})", "",
           f"torch {meta['torch']}, triton {meta['triton']}, commit {meta['commit']}, {meta['date']}", "",
           "## Checks", "", "| check | result | detail |", "| --- | --- | --- |"]  # fmt: skip
    out += [f"| {r['check']} | {'PASS' if r['ok'] else 'FAIL'} | {r['detail']} |" for r in checks]
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
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
               lambda c: check_grouped_wgrad(c, recipe), lambda c: check_grads(c, recipe)):  # fmt: skip
        try:
            fn(checks)
        except Exception as exc:  # record and go on: the report must say what broke
            import traceback

            traceback.print_exc()
            checks.add(f"check raised {type(exc).__name__}", False, str(exc)[:300])
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "nvfp4_gpu_check.json"), "w") as f:
        json.dump({"meta": meta, "checks": checks.rows}, f, indent=1)
    with open(os.path.join(args.out, "nvfp4_gpu_check.md"), "w") as f:
        f.write(_markdown(meta, checks.rows))
    passed = sum(r["ok"] for r in checks.rows)
    print(f"checks: {passed}/{len(checks.rows)} passed")
    if passed != len(checks.rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
