"""Decode at a real model's shape, per layer and as a whole-model estimate (issue 53): a
Qwen3-8B-shaped dense or Qwen3-30B-A3B-shaped MoE model at full vocabulary (151,936, untied
head), random weights, timed at L and 4L decoder layers. Per layer = (step(4L) - step(L)) / 3L;
outside the layers (embedding, final norm, head, sampling) = step(L) - L x per layer; whole model
= outside + (the real model's layers) x per layer. Configs: minite strict NVFP4, the minite bf16
recipe, the same engine on stock kernels, transformers BF16 with a static cache compiled by
Inductor (the stock single-GPU peer). Each figure stands beside the step cost model's roofline
(`fp4_compile/cost/rollout.py`, the same L / 4L slope) and, where one exists, the field's
published figure for the model and card (`../shared/FIELD_NOTES.md`, "Decode on an H100").
Figures on Hopper are "emulated NVFP4 (sm_90)".

    python -m benchmarks.decode_real_shapes --model qwen3-8b [--layers 2] [--batches 1,16]
        [--prompt 128] [--new-tokens 48] [--configs all|LABEL;LABEL] [--hf-batches 1,16]
        [--roofline FILE | --roofline-only FILE]

The decode step is timed as in `benchmarks.rollout` (T(N new tokens) - T(1)) / (N - 1), medians
of warm calls, CUDA graphs on.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.common import environment, write_results
from benchmarks.rollout import (
    ENGINE_CONFIGS,
    HF_LABEL,
    ROOFLINE_RECIPE,
    decode_timing,
    engine_generate,
    hf_generate,
)
from fp4_compile.models import REAL_SHAPES, build_causal_lm, real_shape_note
from fp4_compile.rollout import RolloutEngine

# Public decode figures on an H100 (FIELD_NOTES "Decode on an H100 (public benchmarks)"):
# model -> batch -> (ms per decode step, source)
PUBLISHED = {
    "qwen3-8b": {
        1: (6.86, "vLLM BF16, 6.86 ms/token at batch 1"),
        64: (64 / 6.6, "vLLM BF16, ~6.6k tok/s at concurrency 64"),
        256: (256 / 13.6, "vLLM BF16, ~13.6k tok/s at concurrency 256"),
    },
}


def slope(at_l: float, at_4l: float, layers: int, full: int) -> dict:
    """Per-layer figure, the rest, and the whole-model estimate from a run at L and at 4L."""
    per_layer = (at_4l - at_l) / (3 * layers)
    outside = at_l - layers * per_layer
    return {"per_layer": per_layer, "outside": outside, "whole": outside + full * per_layer}


def ratio(other: dict | None, this: dict) -> str:
    """other's whole-model step / this one's (> 1: this one is faster)."""
    return f"{other['whole'] / this['whole']:.2f}x" if other else "-"


def roofline_table(model_name: str, *, layers: int, prompt: int, new_tokens: int, batches):
    """The cost model's decode roofline (ms) at L and 4L layers per (recipe, batch), at the mean
    context of a generate call in its static cache (CPU, shapes only)."""
    from fp4_compile.cost import step_cost

    context, slots = prompt + new_tokens // 2, prompt + new_tokens
    table = {"context": context, "max_seq_len": slots, "roofline_ms": {}}
    for depth in (layers, 4 * layers):
        model = build_causal_lm(model_name, layers=depth, device="meta")
        note = real_shape_note(model_name, layers=depth)
        for recipe in sorted(set(ROOFLINE_RECIPE.values())):
            by_batch = table["roofline_ms"].setdefault(recipe, {}).setdefault(str(depth), {})
            for b in batches:
                cost = step_cost(
                    model, note, batch=b, context=context, recipe=recipe, max_seq_len=slots
                )
                by_batch[str(b)] = cost["roofline_ms"]
    return table


def measure(label: str, model_name: str, depth: int, args, batches) -> dict:
    """Decode timings of one config at `depth` layers, per batch (errors recorded as strings)."""
    torch._dynamo.reset()
    start = time.perf_counter()
    model = build_causal_lm(model_name, layers=depth, device="cuda")
    print(f"{label} {depth}: model built in {time.perf_counter() - start:.0f} s", flush=True)
    max_len = args.prompt + args.new_tokens
    engine = None
    if label != HF_LABEL:
        engine = RolloutEngine(
            model, max_batch=max(batches), max_seq_len=max_len, **ENGINE_CONFIGS[label]
        )
        print(f"{label} {depth}: engine ready at {time.perf_counter() - start:.0f} s", flush=True)
    out = {}
    for b in batches:
        gen = (
            hf_generate(model, b, args.prompt)
            if engine is None
            else engine_generate(engine, b, args.prompt)
        )
        try:
            out[b] = decode_timing(gen, new_tokens=args.new_tokens, reps=args.reps)
        except Exception as e:  # noqa: BLE001 (recorded in the results, not hidden)
            out[b] = f"{type(e).__name__}: {e}"[:1000]
        print(label, depth, b, out[b], flush=True)
    del engine, model
    torch.cuda.empty_cache()
    return out


def report(rows: dict, roof: dict, *, env: dict, args, batches) -> str:
    full = REAL_SHAPES[args.model][3]
    published = PUBLISHED.get(args.model, {})
    lines = [
        f"# Decode at real shapes, {env['gpu']}, emulated NVFP4 (sm_90), torch {env['torch']}, "
        f"triton {env['triton']}, commit {env['commit']}",
        "",
        f"{real_shape_note(args.model, layers=args.layers)} (and {4 * args.layers}); prompt "
        f"{args.prompt}, {args.new_tokens} new tokens, CUDA graphs. Per layer = (step({4 * args.layers} "
        f"layers) - step({args.layers})) / {3 * args.layers}; whole model = outside + {full} x per layer. "
        f"Roofline: the step cost model at {roof['context']} keys in {roof['max_seq_len']} slots, "
        "the same slope.",
        "",
        "| config | batch | per layer us | roofline per layer us | % roofline (layer) | outside ms "
        "| whole-model step ms | whole-model tok/s | vs transformers | vs bf16 recipe | published |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    whole = {}
    for label, by_depth in rows.items():
        for b in batches:
            lo, hi = by_depth.get(args.layers, {}).get(b), by_depth.get(4 * args.layers, {}).get(b)
            if isinstance(lo, dict) and isinstance(hi, dict):
                whole[label, b] = slope(lo["step_ms"], hi["step_ms"], args.layers, full)
    for (label, b), s in whole.items():
        r = roof["roofline_ms"][ROOFLINE_RECIPE[label]]
        rs = slope(r[str(args.layers)][str(b)], r[str(4 * args.layers)][str(b)], args.layers, full)
        peer, base = whole.get((HF_LABEL, b)), whole.get(("minite bf16 recipe", b))
        pub = published.get(b)
        lines.append(
            f"| {label} | {b} | {s['per_layer'] * 1e3:.1f} | {rs['per_layer'] * 1e3:.1f} | "
            f"{100 * rs['per_layer'] / s['per_layer']:.0f}% | {s['outside']:.3f} | "
            f"{s['whole']:.2f} | {b / s['whole'] * 1e3:.0f} | {ratio(peer, s)} | {ratio(base, s)} | "
            + (f"{pub[0]:.2f} ms ({pub[1]})" if pub else "-")
            + " |"
        )
    lines.append(
        "\nratios: the other config's whole-model step / this one's (> 1: this one is faster)"
    )
    for label, by_depth in rows.items():
        for depth, by_batch in by_depth.items():
            lines += [
                f"- ERROR {label}, {depth} layers, batch {b}: {v[:300]}"
                for b, v in by_batch.items()
                if isinstance(v, str)
            ]
    lines.append("\nRaw decode steps (ms) per config, layers and batch are in the JSON (`decode`).")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(REAL_SHAPES), default="qwen3-8b")
    parser.add_argument("--layers", type=int, default=2, help="L; the slope runs L and 4L layers")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--hf-batches", default="1,16", help=f"the batches of the '{HF_LABEL}' row")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--configs",
        default="all",
        help="'all' or labels separated by ';' " + repr(list(ROOFLINE_RECIPE)),
    )
    parser.add_argument(
        "--roofline", default="", help="a JSON file from --roofline-only (computed on a CPU)"
    )
    parser.add_argument(
        "--roofline-only", default="", metavar="FILE", help="write the roofline JSON and stop"
    )
    args = parser.parse_args()
    if args.layers < 1 or args.new_tokens < 2:
        raise ValueError(
            f"--layers must be >= 1 and --new-tokens >= 2, got {args.layers}, {args.new_tokens}"
        )
    batches = [int(b) for b in args.batches.split(",")]
    labels = list(ROOFLINE_RECIPE) if args.configs == "all" else args.configs.split(";")
    unknown = [lab for lab in labels if lab not in ROOFLINE_RECIPE]
    if unknown:
        raise ValueError(f"--configs: unknown {unknown}; known {list(ROOFLINE_RECIPE)}")
    shapes = dict(
        layers=args.layers, prompt=args.prompt, new_tokens=args.new_tokens, batches=batches
    )
    if args.roofline_only:
        Path(args.roofline_only).write_text(
            json.dumps(roofline_table(args.model, **shapes), indent=1)
        )
        return
    roof = (
        json.loads(Path(args.roofline).read_text())
        if args.roofline
        else roofline_table(args.model, **shapes)
    )
    depths = {str(args.layers), str(4 * args.layers)}
    if roof["context"] != args.prompt + args.new_tokens // 2 or not all(
        depths <= set(by_depth) for by_depth in roof["roofline_ms"].values()
    ):
        raise ValueError(
            f"--roofline {args.roofline} was computed for another prompt / new-tokens / layers"
        )
    env = environment()
    rows = {}
    name = f"decode_{args.model.replace('-', '_').replace('.', '_')}"
    for label in labels:  # results rewritten after each config: a cut-off run keeps what it ran
        label_batches = (
            batches if label != HF_LABEL else [int(b) for b in args.hf_batches.split(",")]
        )
        rows[label] = {
            d: measure(label, args.model, d, args, label_batches)
            for d in (args.layers, 4 * args.layers)
        }
        text = report(rows, roof, env=env, args=args, batches=batches)
        write_results(
            name, {"env": env, "args": vars(args), "decode": rows, "roofline": roof}, text
        )
    print(text)


if __name__ == "__main__":
    main()
