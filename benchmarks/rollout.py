"""Rollout decode throughput: minite strict NVFP4, minite bf16 recipe (same engine and
invariant kernels), the same engine on stock (non-invariant) kernels, and transformers
`generate` BF16, on Qwen3-30B-A3B-shaped layers; same run. Figures: "emulated NVFP4 (sm_90)".

    python -m benchmarks.rollout [--layers 2] [--prompt 256] [--new-tokens 256] [--batches 1,16,64,256]
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import environment, profile_call, profile_markdown, write_results
from fp4_compile import NVFP4Recipe
from fp4_compile.models import qwen3_30b_a3b_layers
from fp4_compile.rl import RolloutEngine


def _engine_rate(engine, batch, prompt, new_tokens):
    prompts = [[1 + (i * 7 + j) % 8000 for j in range(prompt)] for i in range(batch)]
    engine.generate(prompts[:batch], max_new_tokens=4, seed=0)  # warm (compiles both shapes)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    engine.generate(prompts, max_new_tokens=new_tokens, seed=0)
    torch.cuda.synchronize()
    return batch * new_tokens / (time.perf_counter() - t0)


def _profile_engine(engine, batch, prompt, new_tokens=32):
    prompts = [[1 + (i * 7 + j) % 8000 for j in range(prompt)] for i in range(batch)]

    def call():
        engine.generate(prompts, max_new_tokens=new_tokens, seed=0)

    call()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    call()
    torch.cuda.synchronize()
    return profile_call(call, (time.perf_counter() - t0) * 1e3)


def _graphs_bitwise(engine, prompt, batch=64, new_tokens=32) -> dict:
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
    return {"batch": batch, "new_tokens": new_tokens, "tokens_equal": same_tokens,
            "logprobs_differing": differ, "ok": same_tokens and differ == 0}  # fmt: skip


def _hf_rate(model, batch, prompt, new_tokens):
    ids = torch.tensor(
        [[1 + (i * 7 + j) % 8000 for j in range(prompt)] for i in range(batch)], device="cuda"
    )
    kw = dict(
        do_sample=True,
        top_k=0,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=0,
    )
    model.generate(ids, **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model.generate(ids, **kw)
    torch.cuda.synchronize()
    return batch * new_tokens / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument(
        "--profile-batch",
        default="",
        help="also profile one generate call (32 new tokens) per engine at each of these batches "
        "(comma-separated; engines without CUDA graphs)",
    )
    parser.add_argument("--skip-hf", action="store_true", help="no transformers generate baseline")
    parser.add_argument("--name", default="rollout_h200", help="results file stem")
    parser.add_argument(
        "--configs",
        default="all",
        help="'all', 'minite-graphs' (strict and bf16 recipe under CUDA graphs) or engine "
        "config labels separated by ';'",
    )
    args = parser.parse_args()
    env = environment()
    batches = [int(b) for b in args.batches.split(",")]
    profile_batches = [int(b) for b in args.profile_batch.split(",") if b]
    configs = {
        "minite strict NVFP4": dict(recipe=NVFP4Recipe.strict()),
        "minite bf16 recipe": dict(recipe=NVFP4Recipe.bf16()),
        "same engine, stock kernels (not invariant)": dict(compile=False),
        "minite strict NVFP4, CUDA graphs": dict(recipe=NVFP4Recipe.strict(), cuda_graphs=True),
        "minite bf16 recipe, CUDA graphs": dict(recipe=NVFP4Recipe.bf16(), cuda_graphs=True),
        "same engine, stock kernels, CUDA graphs": dict(compile=False, cuda_graphs=True),
    }
    if args.configs == "minite-graphs":  # the bar: strict vs bf16 recipe, CUDA graphs
        configs = {k: v for k, v in configs.items() if k.startswith("minite") and "graphs" in k}
    elif args.configs != "all":
        configs = {k: configs[k] for k in args.configs.split(";")}
    table, errors, profiles = {}, {}, {}
    graph_check = {}
    for label, kw in configs.items():
        torch._dynamo.reset()
        model = qwen3_30b_a3b_layers(layers=args.layers, device="cuda").eval()
        engine = RolloutEngine(
            model, max_batch=max(batches), max_seq_len=args.prompt + args.new_tokens, **kw
        )
        table[label] = {}
        for b in batches:
            try:
                table[label][b] = _engine_rate(engine, b, args.prompt, args.new_tokens)
            except Exception as e:  # recorded, not hidden
                table[label][b] = float("nan")
                errors[f"{label} batch {b}"] = f"{type(e).__name__}: {e}"[:2000]
        print(label, table[label], flush=True)
        if kw.get("cuda_graphs"):
            try:
                graph_check[label] = _graphs_bitwise(engine, args.prompt)
            except Exception as e:
                errors[f"{label} graph check"] = f"{type(e).__name__}: {e}"[:2000]
        for pb in profile_batches if not kw.get("cuda_graphs") else ():
            profiles[f"{label}, batch {pb}"] = _profile_engine(engine, pb, args.prompt)
        del model, engine
        torch.cuda.empty_cache()
    model = qwen3_30b_a3b_layers(layers=args.layers, device="cuda").eval()
    for b in batches if not args.skip_hf else ():
        table.setdefault("transformers generate BF16", {})
        try:
            table["transformers generate BF16"][b] = _hf_rate(
                model, b, args.prompt, args.new_tokens
            )
        except Exception as e:
            table["transformers generate BF16"][b] = float("nan")
            errors[f"hf batch {b}"] = f"{type(e).__name__}: {e}"[:2000]
    base = table.get("minite bf16 recipe") or next(iter(table.values()))
    md = [
        f"# rollout decode tokens/s, {env['gpu']} (emulated NVFP4, sm_90), torch {env['torch']}, "
        f"triton {env['triton']}, commit {env['commit']}",
        f"Qwen3-30B-A3B-shaped, {args.layers} layers, vocab 8192, prompt {args.prompt}, {args.new_tokens} new tokens",
        "",
        "| config | " + " | ".join(f"batch {b}" for b in batches) + " |",
        "| --- | " + " | ".join("---" for _ in batches) + " |",
    ]
    for label, rates in table.items():
        md.append(
            f"| {label} | "
            + " | ".join(f"{rates[b]:.0f} ({rates[b] / base[b]:.2f}x)" for b in batches)
            + " |"
        )
    md.append("\nratios are against minite bf16 recipe (same engine, invariant kernels)")
    for label, chk in graph_check.items():
        md.append(
            f"- {label}: generate with vs without the CUDA graph (batch {chk['batch']}, "
            f"{chk['new_tokens']} tokens): tokens equal {chk['tokens_equal']}, log-probs "
            f"differing {chk['logprobs_differing']} -> {'PASS' if chk['ok'] else 'FAIL'}"
        )
    md.extend(f"- ERROR {k}: {v[:300]}" for k, v in errors.items())
    for label, prof in profiles.items():
        md += profile_markdown(f"{label}, 32 new tokens", prof, "generate call")
    text = "\n".join(md) + "\n"
    print(text)
    write_results(
        args.name,
        {
            "env": env,
            "args": vars(args),
            "tokens_per_s": table,
            "errors": errors,
            "cuda_graph_bitwise": graph_check,
            "profiles": profiles,
        },
        text,
    )


if __name__ == "__main__":
    main()
