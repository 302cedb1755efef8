"""PROBE, not a product path: how fast is the learner step once host launches are gone?

    python -m benchmarks.learner_cuda_graphs_probe [--layers 2] [--batch 8] [--seq 512]

The strict learner step is host-bound on the H200 (`benchmarks.learner`: GPU busy 45-74% of
the step). This compiles the same model with Inductor's CUDA graphs turned on
(`torch._inductor.config.triton.cudagraphs`, what mode="reduce-overhead" sets) for minite
strict and for the BF16 baseline (reduce-overhead too), same run, and times fwd+bwd+AdamW.

Not the contract: the backward's stochastic-rounding seeds are drawn on the host
(`sr_stream.call_seed`), so a replayed graph reuses the captured call's seeds, step after step.
The figures say what removing the host launches is worth (and whether capture works at all);
shipping it needs the call counters on the device first. Figures: "emulated NVFP4 (sm_90)".
"""

from __future__ import annotations

import argparse
import traceback

import torch

from benchmarks.common import cuda_time_ms, environment, write_results
from benchmarks.learner import _step_fn
from fp4_compile import NVFP4Recipe
from fp4_compile.models import qwen3_30b_a3b_layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    args = parser.parse_args()
    env = environment()
    ids = torch.randint(0, 8192, (args.batch, args.seq), device="cuda")
    tokens = args.batch * args.seq
    rows = []
    for label, backend, options in (
        ("inductor BF16, CUDA graphs", "inductor", None),
        ("minite strict, CUDA graphs (probe: SR seeds repeat)", "minite",
         {"recipe": NVFP4Recipe.strict()}),
    ):  # fmt: skip
        torch._dynamo.reset()
        model = qwen3_30b_a3b_layers(layers=args.layers, device="cuda")
        kw = {"options": options} if options else {"mode": "reduce-overhead"}
        row = {"label": label}
        try:
            with torch._inductor.config.patch({"triton.cudagraphs": True}):
                compiled = torch.compile(model, backend=backend, **kw)
                opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
                ms = cuda_time_ms(_step_fn(compiled, ids, opt), warmup=3, iters=5)
            row.update(step_ms=ms, tokens_per_s=tokens / (ms / 1e3))
        except Exception as e:  # recorded, not hidden
            row.update(
                error=f"{type(e).__name__}: {e}"[:1500], traceback=traceback.format_exc()[-4000:]
            )
        print(row, flush=True)
        rows.append(row)
        del model
        torch.cuda.empty_cache()
    md = [f"# learner step with CUDA graphs (PROBE), {env['gpu']}, torch {env['torch']}, "
          f"triton {env['triton']}, commit {env['commit']}",
          f"Qwen3-30B-A3B-shaped, {args.layers} layers, {args.batch}x{args.seq} tokens/step, "
          "fwd+bwd+AdamW; emulated NVFP4 (sm_90); minite's SR seeds repeat across replays here "
          "(not the contract: a probe of what removing host launches is worth)", "",
          "| config | step ms | tokens/s |", "| --- | --- | --- |"]  # fmt: skip
    for r in rows:
        if "error" in r:
            md.append(f"| {r['label']} | ERROR: {r['error'][:300]} | |")
        else:
            md.append(f"| {r['label']} | {r['step_ms']:.1f} | {r['tokens_per_s']:.0f} |")
    text = "\n".join(md) + "\n"
    print(text)
    write_results("learner_cuda_graphs_probe", {"env": env, "args": vars(args), "rows": rows}, text)


if __name__ == "__main__":
    main()
