"""Rollout decode speed, the figure an RL user reads: decode alone (tokens/s and ms per step,
graph replays), with prefill and the one-time capture timed apart, at batch 1 / 16 / 64 / 256,
for minite strict NVFP4, the minite bf16 recipe (same engine, same invariant kernels, no
quantization), the same engine on stock kernels (no minite lowering: not invariant), and
transformers BF16 with a static cache compiled by Inductor (the stock single-GPU peer). Every
row stands beside the step cost model's roofline time for it (`fp4_compile/cost/rollout.py`, the
H200's measured copy rate and BF16 peak): % of roofline = roofline / measured.
Qwen3-30B-A3B-shaped layers (`fp4_compile.models.qwen3_30b_a3b_layers`), random weights.
Figures on Hopper are "emulated NVFP4 (sm_90)".

    python -m benchmarks.rollout [--layers 2] [--prompt 256] [--new-tokens 128]
        [--batches 1,16,64,256] [--configs all|LABEL;LABEL] [--skip-hf] [--hf-batches 1,64]
        [--roofline FILE | --roofline-only FILE] [--profile-batch 64]

How decode alone is timed: one `generate` call with N new tokens costs prefill + (N - 1)
decode steps (+ the capture, on the first call of a batch bucket only); a call with 1 new token
costs the prefill alone. So a decode step = (T(N) - T(1)) / (N - 1), each T the median of
`--reps` warm calls. The first call per batch is reported apart ("first call": compile +
capture + prefill + decode).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import torch

from benchmarks.common import environment, median, profile_call, profile_markdown, write_results
from fp4_compile import NVFP4Recipe
from fp4_compile.models import qwen3_30b_a3b_layers
from fp4_compile.rollout import RolloutEngine

ENGINE_CONFIGS = {
    "minite strict NVFP4": {"recipe": NVFP4Recipe.strict(), "cuda_graphs": True},
    "minite bf16 recipe": {"recipe": NVFP4Recipe.bf16(), "cuda_graphs": True},
    "same engine, stock kernels": {"compile": False, "cuda_graphs": True},
}
HF_LABEL = "transformers BF16, static cache, Inductor"
ROOFLINE_RECIPE = {  # which cost-model recipe prices each row
    "minite strict NVFP4": "strict",
    "minite bf16 recipe": "bf16",
    "same engine, stock kernels": "stock",
    HF_LABEL: "stock",
}


def _prompts(batch: int, prompt: int, vocab: int) -> list[list[int]]:
    return [[1 + (i * 7 + j) % (vocab - 1) for j in range(prompt)] for i in range(batch)]


def _wall_s(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def decode_timing(generate, *, new_tokens: int, reps: int) -> dict:
    """generate(n) runs one call with n new tokens. Returns the first call's seconds, the
    prefill (1 new token) and one decode step, in ms (medians of `reps` warm calls)."""
    first_s = _wall_s(lambda: generate(new_tokens))
    generate(1)
    prefill = [_wall_s(lambda: generate(1)) for _ in range(reps)]
    full = [_wall_s(lambda: generate(new_tokens)) for _ in range(reps)]
    step_ms = (median(full) - median(prefill)) / (new_tokens - 1) * 1e3
    return {"first_call_s": first_s, "prefill_ms": median(prefill) * 1e3, "step_ms": step_ms}


def engine_generate(engine, batch: int, prompt: int):
    prompts = _prompts(batch, prompt, engine.vocab_size)
    return lambda n: engine.generate(prompts, max_new_tokens=n, seed=0)


def hf_generate(model, batch: int, prompt: int):
    ids = torch.tensor(_prompts(batch, prompt, model.config.vocab_size), device="cuda")
    mask = torch.ones_like(ids)

    def run(n: int):
        model.generate(
            ids,
            attention_mask=mask,
            do_sample=True,
            top_k=0,
            max_new_tokens=n,
            min_new_tokens=n,
            pad_token_id=0,
            cache_implementation="static",
        )

    return run


def graphs_bitwise(engine, prompt: int, batch: int = 64, new_tokens: int = 32) -> dict:
    """The same generate call with and without the CUDA graph: tokens and log-probs equal?"""
    v = engine.vocab_size - 1
    prompts = [[1 + (i * 5 + j) % v for j in range(prompt - i % 7)] for i in range(batch)]
    with_graph = engine.generate(prompts, max_new_tokens=new_tokens, seed=11)
    engine.cuda_graphs = False
    try:
        plain = engine.generate(prompts, max_new_tokens=new_tokens, seed=11)
    finally:
        engine.cuda_graphs = True
    same_tokens = with_graph.tokens == plain.tokens
    differ = sum(
        int((a.view(torch.int32) != b.view(torch.int32)).sum())
        for a, b in zip(with_graph.logprobs, plain.logprobs)
    )
    return {
        "batch": batch,
        "new_tokens": new_tokens,
        "tokens_equal": same_tokens,
        "logprobs_differing": differ,
        "ok": same_tokens and differ == 0,
    }


def roofline_table(*, layers: int, prompt: int, new_tokens: int, batches: list[int]) -> dict:
    """The step cost model's decode roofline (ms) per (cost-model recipe, batch), at the mean
    context of a generate call (prompt + new_tokens / 2 keys) in its static cache (CPU, shapes
    only: seconds per entry)."""
    from fp4_compile.cost import build_model, step_cost

    model, note = build_model("qwen3-30b-a3b", layers=layers)
    context, slots = prompt + new_tokens // 2, prompt + new_tokens
    table = {"model": note, "context": context, "max_seq_len": slots, "roofline_ms": {}}
    for recipe in sorted(set(ROOFLINE_RECIPE.values())):
        table["roofline_ms"][recipe] = {
            str(b): step_cost(
                model, note, batch=b, context=context, recipe=recipe, max_seq_len=slots
            )["roofline_ms"]
            for b in batches
        }
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--reps", type=int, default=3, help="warm calls per timed figure")
    parser.add_argument(
        "--configs",
        default="all",
        help="'all' or labels separated by ';' " + repr([*ENGINE_CONFIGS, HF_LABEL]),
    )
    parser.add_argument("--skip-hf", action="store_true", help=f"no '{HF_LABEL}' row")
    parser.add_argument(
        "--hf-batches",
        default="1,64",
        help=f"the batches of the '{HF_LABEL}' row (Inductor "
        "compiles it anew for every batch: about a minute each)",
    )
    parser.add_argument(
        "--roofline",
        default="",
        help="a JSON file written by --roofline-only (computed on a "
        "CPU beforehand: the GPU call then spends no time on the cost model)",
    )
    parser.add_argument(
        "--roofline-only",
        default="",
        metavar="FILE",
        help="compute the cost model's roofline for these shapes, write FILE, and stop",
    )
    parser.add_argument("--profile-batch", default="", help="profile one call at these batches")
    parser.add_argument("--name", default="rollout_decode", help="results file stem")
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    shapes = {"layers": args.layers, "prompt": args.prompt, "new_tokens": args.new_tokens}
    if args.roofline_only:
        table = roofline_table(**shapes, batches=batches)
        Path(args.roofline_only).write_text(json.dumps(table, indent=1))
        print(json.dumps(table["roofline_ms"], indent=1))
        return
    if args.roofline:
        roof = json.loads(Path(args.roofline).read_text())
        if (roof["context"], roof["max_seq_len"]) != (
            args.prompt + args.new_tokens // 2,
            args.prompt + args.new_tokens,
        ):
            raise ValueError(f"--roofline {args.roofline} was computed for other shapes")
    else:
        roof = roofline_table(**shapes, batches=batches)
    env = environment()
    labels = [*ENGINE_CONFIGS, HF_LABEL]
    if args.configs != "all":
        labels = args.configs.split(";")
        unknown = [lab for lab in labels if lab not in ROOFLINE_RECIPE]
        if unknown:
            raise ValueError(f"--configs: unknown {unknown}; known {list(ROOFLINE_RECIPE)}")
    if args.skip_hf and HF_LABEL in labels:
        labels.remove(HF_LABEL)
    profile_batches = [int(b) for b in args.profile_batch.split(",") if b]
    rows, errors, graph_check, profiles = {}, {}, {}, {}
    for label in labels:
        measure_config(
            label,
            args,
            batches,
            profile_batches,
            rows=rows,
            errors=errors,
            graph_check=graph_check,
            profiles=profiles,
        )
        torch.cuda.empty_cache()  # the config's model and engine are gone with its frame
    text = report(rows, roof, graph_check, errors, profiles, env=env, args=args, batches=batches)
    print(text)
    write_results(
        args.name,
        {
            "env": env,
            "args": vars(args),
            "decode": rows,
            "roofline": roof,
            "cuda_graph_bitwise": graph_check,
            "errors": errors,
            "profiles": profiles,
        },
        text,
    )


def measure_config(
    label, args, batches, profile_batches, *, rows, errors, graph_check, profiles
) -> None:
    """Time one config at every batch (and profile it where asked); errors are recorded."""
    torch._dynamo.reset()
    max_len = args.prompt + args.new_tokens
    model = qwen3_30b_a3b_layers(layers=args.layers, device="cuda").eval()
    engine = None
    if label != HF_LABEL:
        engine = RolloutEngine(
            model, max_batch=max(batches), max_seq_len=max_len, **ENGINE_CONFIGS[label]
        )

    def make(b: int):
        if engine is None:
            return hf_generate(model, b, args.prompt)
        return engine_generate(engine, b, args.prompt)

    rows[label] = {}
    if engine is None:
        batches = [int(b) for b in args.hf_batches.split(",") if int(b) in batches]
    for b in batches:
        try:
            rows[label][b] = decode_timing(make(b), new_tokens=args.new_tokens, reps=args.reps)
        except Exception as e:  # noqa: BLE001 (recorded in the results, not hidden)
            errors[f"{label}, batch {b}"] = f"{type(e).__name__}: {e}"[:2000]
        print(label, b, rows[label].get(b), flush=True)
    if engine is not None and ENGINE_CONFIGS[label].get("cuda_graphs"):
        try:
            graph_check[label] = graphs_bitwise(engine, args.prompt)
        except Exception as e:  # noqa: BLE001
            errors[f"{label}, graph check"] = f"{type(e).__name__}: {e}"[:2000]
    for pb in profile_batches:
        gen = make(pb)
        gen(32)
        wall_ms = _wall_s(functools.partial(gen, 32)) * 1e3
        profiles[f"{label}, batch {pb}"] = profile_call(functools.partial(gen, 32), wall_ms)


def step_ratio(other: dict, b: int, step_ms: float) -> str:
    """other's step time / this one's at batch b (> 1: this one is faster)."""
    o = other.get(b)
    return f"{o['step_ms'] / step_ms:.2f}x" if o else "-"


def report(rows, roof, graph_check, errors, profiles, *, env, args, batches) -> str:
    base = rows.get("minite bf16 recipe", {})
    peer = rows.get(HF_LABEL, {})
    md = [
        (
            f"# Rollout decode, {env['gpu']}, emulated NVFP4 (sm_90), torch {env['torch']}, "
            f"triton {env['triton']}, commit {env['commit']}"
        ),
        "",
        (
            f"Qwen3-30B-A3B-shaped, {args.layers} layers, vocab 8192, prompt {args.prompt}, "
            f"{args.new_tokens} new tokens; decode step = (T({args.new_tokens} tokens) - T(1 "
            f"token)) / {args.new_tokens - 1}, medians of {args.reps} warm calls. Roofline: the "
            f"step cost model (`fp4_compile/cost/rollout.py`) at {roof['context']} keys in "
            f"{roof['max_seq_len']} slots; % roofline = roofline / measured step."
        ),
        "",
        (
            "| config | batch | decode tok/s | step ms | vs bf16 recipe | vs transformers "
            "| roofline ms | % roofline | prefill ms | first call s |"
        ),
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, by_batch in rows.items():
        for b in batches:
            r = by_batch.get(b)
            if r is None:  # not run (--hf-batches), or failed (listed below)
                if f"{label}, batch {b}" in errors:
                    md.append(f"| {label} | {b} | error | | | | | | | |")
                continue
            roof_ms = roof["roofline_ms"][ROOFLINE_RECIPE[label]][str(b)]
            tok_s = b / r["step_ms"] * 1e3

            md.append(
                f"| {label} | {b} | {tok_s:.0f} | {r['step_ms']:.3f} | {step_ratio(base, b, r['step_ms'])} | "
                f"{step_ratio(peer, b, r['step_ms'])} | {roof_ms:.3f} | {100 * roof_ms / r['step_ms']:.0f}% | "
                f"{r['prefill_ms']:.1f} | {r['first_call_s']:.1f} |"
            )
    md.append("\nratios: the other config's step time / this one's (> 1: this one is faster)")
    for label, chk in graph_check.items():
        md.append(
            f"- {label}: generate with vs without the CUDA graph (batch {chk['batch']}, "
            f"{chk['new_tokens']} tokens): tokens equal {chk['tokens_equal']}, log-probs "
            f"differing {chk['logprobs_differing']} -> {'PASS' if chk['ok'] else 'FAIL'}"
        )
    md.extend(f"- ERROR {k}: {v[:300]}" for k, v in errors.items())
    for label, prof in profiles.items():
        md += profile_markdown(f"{label}, 32 new tokens", prof, "generate call")
    return "\n".join(md) + "\n"


if __name__ == "__main__":
    main()
