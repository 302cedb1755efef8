"""GPU check of the engine's CUDA-graph decode (`RolloutEngine(..., cuda_graphs=True)`): the same
generate call with and without the graph gives the same tokens and bitwise the same log-probs,
for tiny Qwen3 / Qwen3-MoE and two Qwen3-30B-A3B-shaped layers, strict and bf16 recipes; and
the wall time of both. Figures: emulated NVFP4 (sm_90).

    python -m benchmarks.cuda_graph_gpu_check
"""

from __future__ import annotations

import time

import torch

from benchmarks.common import environment, write_results
from benchmarks.rollout import _graphs_bitwise
from fp4_compile import NVFP4Recipe
from fp4_compile.models import qwen3_30b_a3b_layers, tiny_qwen3, tiny_qwen3_moe
from fp4_compile.rl import RolloutEngine


def _timed(engine, prompts, new_tokens):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    engine.generate(prompts, max_new_tokens=new_tokens, seed=0)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> None:
    env = environment()
    rows = []
    models = (
        ("tiny Qwen3", lambda: tiny_qwen3(layers=2).cuda().bfloat16(), 24),
        ("tiny Qwen3-MoE", lambda: tiny_qwen3_moe(layers=2).cuda().bfloat16(), 24),
        ("Qwen3-30B-A3B-shaped x2", lambda: qwen3_30b_a3b_layers(layers=2, device="cuda"), 64),
    )
    for name, build, prompt in models:
        for rname, recipe in (("strict", NVFP4Recipe.strict()), ("bf16", NVFP4Recipe.bf16())):
            torch._dynamo.reset()
            row = {"model": name, "recipe": rname}
            try:
                model = build().eval()
                engine = RolloutEngine(model, recipe=recipe, max_batch=64,
                                       max_seq_len=prompt + 64, cuda_graphs=True)  # fmt: skip
                row.update(_graphs_bitwise(engine, prompt, batch=64, new_tokens=32))
                prompts = [[1 + (i * 3 + j) % 100 for j in range(prompt)] for i in range(64)]
                row["graph_s"] = _timed(engine, prompts, 64)
                engine.cuda_graphs = False
                row["plain_s"] = _timed(engine, prompts, 64)
            except Exception as e:  # recorded, not hidden
                row.update(ok=False, error=f"{type(e).__name__}: {e}"[:1500])
            print(row, flush=True)
            rows.append(row)
    md = [
        f"# CUDA-graph decode == plain decode, {env['gpu']} (emulated NVFP4, sm_90), torch "
        f"{env['torch']}, triton {env['triton']}, commit {env['commit']}",
        "batch 64, 32 new tokens for the bitwise check; 64 new tokens for the times",
        "",
        "| model | recipe | result | tokens equal | log-probs differing | graph s | plain s | error |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        md.append(
            f"| {r['model']} | {r['recipe']} | {'PASS' if r.get('ok') else 'FAIL'} | "
            f"{r.get('tokens_equal', '')} | {r.get('logprobs_differing', '')} | "
            f"{r.get('graph_s', float('nan')):.3f} | {r.get('plain_s', float('nan')):.3f} | "
            f"{r.get('error', '')[:300]} |"
        )
    text = "\n".join(md) + "\n"
    print(text)
    write_results("cuda_graph_gpu_check", {"env": env, "rows": rows}, text)


if __name__ == "__main__":
    main()
