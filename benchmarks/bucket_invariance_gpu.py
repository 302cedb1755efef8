"""Do the pinned GEMM configs give the same bits for every M? A stress check on the GPU.

    python -m benchmarks.bucket_invariance_gpu

Every pinned M bucket computes the same rows: row i of op(x[:m]) must equal row i of op(x)
bitwise (the batch invariance that learner == rollout rests on). Random-normal data hides
accumulation differences; these rows are cancellation-heavy (magnitudes 1e-4..1e2 across K),
at K in {32, 256, 2048}, for the NVFP4 linear (packed and on-grid weights), the grouped MoE GEMM
(whose bucket follows tokens per expert) and the BF16 invariant linear. Run twice: with the
pinned tables, and with the tables as they were before 2026-12-02 (a 16-row mma.sync bucket
next to wgmma ones), so the record shows what the pin fixes. Figures are bit counts.
"""

from __future__ import annotations

import contextlib

import torch

from benchmarks.common import environment, write_results
from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.codegen import configs
from fp4_compile.codegen.nvfp4 import gemm as impl
from fp4_compile.testing import count_bytes_differ

MS = (1, 7, 16, 17, 63, 64, 65, 129, 257)
KS = (32, 256, 2048)


@contextlib.contextmanager
def old_tables():
    """The sm_90 tables before the BLOCK_M >= 64 pin (a 16-row bucket)."""
    key = ("sm_90", "bf16", "nvfp4_gemm")
    saved_g, saved_l = configs.PINNED[key], configs.LINEAR["sm_90"]
    configs.PINNED[key] = (
        (16, configs.TileConfig(16, 64, 64, num_warps=4, num_stages=4)),
        *saved_g,
    )
    configs.LINEAR["sm_90"] = (
        (16, configs.TileConfig(16, 64, 64, num_warps=4, num_stages=4)), *saved_l)  # fmt: skip
    try:
        yield
    finally:
        configs.PINNED[key], configs.LINEAR["sm_90"] = saved_g, saved_l


def _x(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.logspace(-4, 2, shape[-1])
    return x[..., torch.randperm(shape[-1], generator=g)].to(torch.bfloat16).cuda()


def run_checks() -> list[dict]:
    from fp4_compile.codegen.invariant import forward_kernels as ik

    recipe, rows = NVFP4Recipe.strict(), []
    for k in KS:
        n = 256
        x, w = _x(300, k, seed=k), _x(n, k, seed=k + 1).float()
        wq = ref.quantize(w, block="16x16")
        og = wq.on_grid(torch.bfloat16)
        for label, wog in (("nvfp4 linear packed", None), ("nvfp4 linear on-grid", og)):
            args = (wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode, wog, None)
            full = impl.cuda_linear(x, *args, recipe, None)
            bad = sum(count_bytes_differ(impl.cuda_linear(x[:m], *args, recipe, None), full[:m])
                      for m in MS)  # fmt: skip
            rows.append({"op": label, "K": k, "elements_differ": bad})
        full = ik.linear(x, w.bfloat16(), None, torch.bfloat16)
        bad = sum(count_bytes_differ(ik.linear(x[:m], w.bfloat16(), None, torch.bfloat16), full[:m])
                  for m in MS)  # fmt: skip
        rows.append({"op": "bf16 invariant linear", "K": k, "elements_differ": bad})
        # grouped: 8 experts; the same expert rows alone (per-expert call) vs inside a big call
        e = 8
        we = _x(e, 128, k, seed=k + 2).float()
        wqe = ref.quantize_experts(we)
        args = (wqe.codes, wqe.block_scales.view(torch.uint8), wqe.global_decode, None, None)
        bad = 0
        for per in (2, 17, 70):
            xs = _x(e * per, k, seed=k + per)
            offs = (torch.arange(1, e + 1, device="cuda") * per).to(torch.int32)
            y = impl.cuda_linear(xs, *args, recipe, None, offsets=offs)
            for i in range(e):
                one = impl.cuda_linear(xs[i * per : (i + 1) * per], wqe.codes[i],
                                       wqe.block_scales[i].view(torch.uint8),
                                       wqe.global_decode[i].reshape(()), None, None, recipe, None)  # fmt: skip
                bad += count_bytes_differ(y[i * per : (i + 1) * per], one)
        rows.append({"op": "nvfp4 grouped vs per-expert", "K": k, "elements_differ": bad})
    return rows


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("this check needs a CUDA GPU")
    env = environment()
    pinned = run_checks()
    with old_tables():
        before = run_checks()
    lines = [f"# Bucket invariance under cancellation, {env['gpu']}", "",
             f"torch {env['torch']}, triton {env['triton']}, commit {env['commit']}. Elements "
             f"differing bitwise, summed over m in {MS} (row i of op(x[:m]) vs op(x)); grouped: "
             "every expert's rows in one call vs alone, at 2 / 17 / 70 tokens per expert.", "",
             "| op | K | pinned tables (BLOCK_M >= 64) | before (16-row mma.sync bucket) |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    for p, b in zip(pinned, before):
        lines.append(f"| {p['op']} | {p['K']} | {p['elements_differ']} | {b['elements_differ']} |")
        print(p, b, flush=True)
    ok = all(p["elements_differ"] == 0 for p in pinned)
    lines += ["", f"pinned tables: {'PASS' if ok else 'FAIL'} (0 differing elements required)"]
    payload = {"env": env, "pinned": pinned, "before": before, "ok": ok}
    for path in write_results("bucket_invariance_gpu", payload, "\n".join(lines) + "\n"):
        print("wrote", path)
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
