"""GPU check of the learner under CUDA graphs (`options={"cuda_graphs": True}`): each replay
draws fresh stochastic-rounding noise, and its numbers are exactly those of the same compiled
step run without graphs on the same seeds.

Per model and recipe, on one batch and fixed weights (no optimizer step), five forward+backward
steps of the graph-compiled model (Inductor warms up, records, then replays), then:
  * replay_noise_fresh: two replays give different gradients (SR noise differs per replay),
    the same logits (the forward has no noise);
  * graph == plain: with the stochastic-rounding state restored to that before the last
    replay, the model compiled WITHOUT graphs, with its backward forced onto the device seed
    path (what a capture takes), gives bitwise the same logits and gradients;
  * resume: restoring that state and replaying again gives bitwise the same gradients.
Figures: emulated NVFP4 (sm_90).

    python -m benchmarks.learner_cuda_graphs_gpu_check
"""

from __future__ import annotations

import copy

import torch

from benchmarks.common import environment, write_results
from fp4_compile import NVFP4Recipe
from fp4_compile.codegen.nvfp4 import linear as linear_module
from fp4_compile.models import qwen3_30b_a3b_layers, tiny_qwen3_moe
from fp4_compile.sr_stream import set_sr_state, sr_state
from fp4_compile.testing import count_bytes_differ


def _step(compiled, model, ids):
    """One forward+backward; logits and gradients cloned (a replay reuses the graph's memory)."""
    for p in model.parameters():
        p.grad = None
    logits = compiled(input_ids=ids, use_cache=False).logits
    logits.float().logsumexp(-1).mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logits.detach().clone(), grads


def _differ(a: dict, b: dict) -> tuple[int, int]:
    """(tensors with any differing byte, total differing bytes) over the common names."""
    if a.keys() != b.keys():
        raise AssertionError(f"gradient sets differ: {sorted(a.keys() ^ b.keys())[:5]}")
    counts = [count_bytes_differ(a[k], b[k]) for k in a]
    return sum(c > 0 for c in counts), sum(counts)


def check(name, build, ids) -> dict:
    recipe = NVFP4Recipe.strict()
    torch._dynamo.reset()
    set_sr_state(None)
    model = build()
    plain_model = copy.deepcopy(model)
    graphs = torch.compile(model, backend="minite", options={"recipe": recipe, "cuda_graphs": True})
    runs, states = [], []
    for _ in range(5):
        states.append(sr_state())
        runs.append(_step(graphs, model, ids))
    row = {"model": name, "recipe": "strict"}
    row["replay_logits_differ"] = count_bytes_differ(runs[3][0], runs[4][0])
    row["replay_grads_differ"] = _differ(runs[3][1], runs[4][1])[0]
    row["grad_tensors"] = len(runs[4][1])
    # the same step without graphs, backward forced onto the device seed path
    plain = torch.compile(plain_model, backend="minite", options={"recipe": recipe})
    real_capturing = linear_module.capturing
    linear_module.capturing = lambda device: device.type == "cuda"
    try:
        set_sr_state(states[4])
        logits, grads = _step(plain, plain_model, ids)
    finally:
        linear_module.capturing = real_capturing
    row["plain_logits_differ"] = count_bytes_differ(runs[4][0], logits)
    row["plain_grads_differ"], row["plain_grad_bytes_differ"] = _differ(runs[4][1], grads)
    set_sr_state(states[4])
    again = _step(graphs, model, ids)
    row["resume_grads_differ"] = _differ(runs[4][1], again[1])[0]
    row["ok"] = (
        row["replay_logits_differ"] == 0
        and row["replay_grads_differ"] > 0  # strict: dY rounds stochastically
        and row["plain_logits_differ"] == 0
        and row["plain_grads_differ"] == 0
        and row["resume_grads_differ"] == 0
    )
    return row


def main() -> None:
    env = environment()
    rows = []
    ids_small = torch.randint(0, 128, (2, 64), device="cuda")
    ids_30b = torch.randint(0, 8192, (4, 256), device="cuda")
    models = (
        ("tiny Qwen3-MoE", lambda: tiny_qwen3_moe(layers=2).cuda().bfloat16(), ids_small),
        ("Qwen3-30B-A3B-shaped x2", lambda: qwen3_30b_a3b_layers(layers=2, device="cuda"), ids_30b),
    )
    for name, build, ids in models:
        try:
            row = check(name, build, ids)
        except Exception as e:  # recorded, not hidden
            import traceback

            row = {"model": name, "ok": False, "error": f"{type(e).__name__}: {e}"[:1500],
                   "traceback": traceback.format_exc()[-4000:]}  # fmt: skip
        print(row, flush=True)
        rows.append(row)
    md = [
        f"# learner CUDA graphs: fresh SR noise per replay, replay == plain step, {env['gpu']} "
        f"(emulated NVFP4, sm_90), torch {env['torch']}, triton {env['triton']}, commit {env['commit']}",
        "",
        "| model | recipe | result | replay logits differ | replay grads differ | plain logits differ "
        "| plain grads differ | resume grads differ | grad tensors | error |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        md.append(
            f"| {r['model']} | {r.get('recipe', '')} | {'PASS' if r.get('ok') else 'FAIL'} | "
            f"{r.get('replay_logits_differ', '')} | {r.get('replay_grads_differ', '')} | "
            f"{r.get('plain_logits_differ', '')} | {r.get('plain_grads_differ', '')} | "
            f"{r.get('resume_grads_differ', '')} | {r.get('grad_tensors', '')} | "
            f"{r.get('error', '')[:300]} |"
        )
    text = "\n".join(md) + "\n"
    print(text)
    write_results("learner_cuda_graphs_gpu_check", {"env": env, "rows": rows}, text)


if __name__ == "__main__":
    main()
