"""The rollout step cost model (CPU, shapes only, no kernel runs): per op and per step, kernel
launches, bytes read and written, FLOPs and roofline time on the H200, from the lowered prefill
and decode graphs.

    python -m benchmarks.step_cost --model qwen3-30b-a3b --batch 64 --context 512 --recipe strict
    python -m benchmarks.step_cost --model path/to/config.json --batch 1 --context 512 --json
    python -m benchmarks.step_cost --all          # the committed tables (benchmarks/results/)

The learner step (forward + backward + AdamW): `python -m benchmarks.step_cost_learner`.

The graph is the rollout step (`fp4_compile.rollout.step.RolloutStep`) captured with
`torch.export` on meta tensors and put through the same pass pipeline and recipe as the engine
and `export_rollout` (`fp4_compile.passes.run_pipeline`); `--recipe stock` skips the pipeline
(transformers' own ATen ops, as a stock Inductor would launch them; the launches of eager
PyTorch, one per op, are `launches_eager`). Decode = one new token per sequence attending to L
(`--context`) keys in a static cache of S (`--max-seq-len`, default L) slots; prefill = a prompt
of L tokens. The counting rules (launches, Inductor fusion, bytes, MoE experts touched, KV cache
reads, roofline constants and the result files that measured them) are below and
implemented in `benchmarks/step_cost_rules.py`; docs/step_cost.md is the guide.

Rules (shapes only; no kernel runs):
- No kernel: views and metadata (view, reshape of a viewable input, transpose, expand, slice,
  getitem, detach, asserts, sizes, a `to` that keeps the dtype). A reshape of an expand is a
  copy (it materializes).
- Per weight version, not per step: `fp4_compile::quantize` / `weight_group_amax` of a parameter
  (the engine's weight store holds them: `fp4_compile/rollout/weight_store.py`; listed apart, never in the step's totals).
- One launch per `fp4_compile` op, plus the launches its CUDA dispatch adds (`EXTRA_LAUNCHES`:
  the activation quantize inside `nvfp4_linear` / `nvfp4_grouped_mm`), plus one per call where an
  NVFP4 GEMM sees >= `ONGRID_FORWARD_MIN_ROWS` rows per weight and the graph gives it no on-grid
  copy (it dequantizes the packed weight each call: `codegen/nvfp4/gemm.py`).
- One launch per extern ATen kernel (`EXTERN`: GEMMs, SDPA, sort / top-k / scans / scatters).
- Every other ATen op is Inductor-fusible (pointwise or a simple reduction): a connected run of
  them that no other kernel separates (same count of kernels on their longest input path) is ONE
  launch, reading what enters the run and writing what leaves it.
- Bytes = tensor arguments read + outputs written, a view counted at min(its size, its base's).
  Not read: an NVFP4 GEMM's master weight and, in the `_quantized` forms, its high-precision x
  (the kernels read packed codes + E4M3 scales + global scales, and the on-grid activation);
  an embedding reads its output's rows of the table; a grouped (MoE) GEMM reads its weights'
  experts in the fraction a step can touch, E * (1 - (1 - k/E)^(B*Tq)) of E (uniform routing).
- KV cache: an in-place write into a cache input writes the new tokens only; attention reads
  the filled length (L) when the graph tells the kernel where each row's keys end (a length
  tensor or a mask: the kernel stops at the block holding a row's last visible key), the whole
  static cache (S) otherwise; an op other than attention that reads a cache and writes at least
  a cache layer's bytes is a copy of the cache (`copies_kv_cache`).
- FLOPs: GEMMs 2*M*N*K, attention 4*B*H*Tq*keys*D; other ops 0.
- Roofline per row: max(bytes / COPY_BYTES_PER_S, flops / BF16_FLOPS_PER_S); a step's is the sum.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

from benchmarks.common import environment, write_results
from benchmarks.step_cost_rules import BF16_FLOPS_PER_S, COPY_BYTES_PER_S, OpCost, step_costs

RECIPES = ("strict", "bf16", "stock")
# benchmarks/rollout.py's model: Qwen3-30B-A3B-shaped layers, 2 of 48, vocabulary 8192
BENCH_LAYERS = 2
BUILTIN_NOTES = {
    "qwen3-30b-a3b": "Qwen3-30B-A3B-shaped (hidden 2048, 32 q / 4 kv heads of 128, 128 experts, "
    "top-8, moe_intermediate 768), vocab 8192: benchmarks/rollout.py's model",
    "qwen3-8b": "Qwen3-8B-shaped dense (hidden 4096, 32 q / 8 kv heads of 128, intermediate "
    "12288, vocab 151936)",
}


def build_model(spec: str, *, layers: int | None = None) -> tuple[torch.nn.Module, str]:
    """(a random-init BF16 causal LM on the meta device, a line describing it). `spec`: a
    built-in name (`BUILTIN_NOTES`), a transformers config.json, or a checkpoint folder.
    Built-ins keep the rollout benchmark's `BENCH_LAYERS` layers unless `layers` says otherwise."""
    import transformers

    if spec in BUILTIN_NOTES:
        depth = BENCH_LAYERS if layers is None else layers
        full = 48 if spec == "qwen3-30b-a3b" else 36
        note = f"{BUILTIN_NOTES[spec]}; {depth} of its {full} layers"
        if spec == "qwen3-30b-a3b":
            from fp4_compile.models import qwen3_30b_a3b_layers

            return qwen3_30b_a3b_layers(layers=depth, device="meta").eval(), note
        cfg = transformers.Qwen3Config(
            vocab_size=151936, hidden_size=4096, intermediate_size=12288,
            num_hidden_layers=depth, num_attention_heads=32, num_key_value_heads=8,
            head_dim=128, max_position_embeddings=40960, tie_word_embeddings=False,
        )  # fmt: skip
    else:
        path = Path(spec)
        if not path.exists():
            raise ValueError(
                f"--model {spec!r} is neither a built-in ({sorted(BUILTIN_NOTES)}) nor an "
                "existing config.json / checkpoint folder"
            )
        cfg = transformers.AutoConfig.from_pretrained(str(path))
        if layers is not None:
            cfg.num_hidden_layers = layers
        note = f"{path} ({cfg.model_type}), {cfg.num_hidden_layers} layers"
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return model.to(torch.bfloat16).eval(), note


def _config(model):
    return getattr(model.config, "text_config", None) or model.config


def step_inputs(model, *, batch: int, tokens: int, context: int, max_seq_len: int) -> tuple:
    """Meta inputs of the rollout step: ids / positions [B, Tq] (the last Tq of L positions),
    kv lengths [B], and k_0, v_0, ... [B, H_kv, S, D]."""
    cfg = _config(model)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    meta = dict(device="meta")
    ids = torch.zeros((batch, tokens), dtype=torch.long, **meta)
    pos = torch.zeros((batch, tokens), dtype=torch.long, **meta)
    kv_len = torch.full((batch,), context, dtype=torch.long, **meta)
    shape = (batch, cfg.num_key_value_heads, max_seq_len, head_dim)
    caches = [torch.zeros(shape, dtype=torch.bfloat16, **meta)
              for _ in range(2 * cfg.num_hidden_layers)]  # fmt: skip
    return (ids, pos, kv_len, *caches)


def lowered_step(model, recipe: str, *, batch: int, tokens: int, context: int, max_seq_len: int):
    """The rollout step's ExportedProgram at these static shapes, through minite's pass pipeline
    with `recipe` ("strict", "bf16"), or as transformers' own ops ("stock")."""
    from fp4_compile import NVFP4Recipe
    from fp4_compile.passes import run_pipeline
    from fp4_compile.rollout.step import RolloutStep

    if recipe not in RECIPES:
        raise ValueError(f"recipe must be one of {RECIPES}, got {recipe!r}")
    example = step_inputs(model, batch=batch, tokens=tokens, context=context,
                          max_seq_len=max_seq_len)  # fmt: skip
    with torch.no_grad():
        program = torch.export.export(RolloutStep(model).eval(), example, strict=False)
        if recipe != "stock":
            run_pipeline(program.graph_module, getattr(NVFP4Recipe, recipe)())
    return program


def expert_fraction(model, tokens: int) -> tuple[float, str]:
    """(expected fraction of experts a step of `tokens` tokens touches, the assumption in words)."""
    cfg = _config(model)
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None)
    if not experts:
        return 1.0, "dense model: every weight is read"
    k = cfg.num_experts_per_tok
    touched = experts * (1 - (1 - k / experts) ** tokens)
    return touched / experts, (
        f"MoE: {tokens} tokens x top-{k} of {experts} experts, uniform independent routing: "
        f"E*(1-(1-k/E)^T) = {touched:.1f} experts touched per layer; expert weights counted "
        "for those only"
    )


def phase_cost(model, recipe: str, *, batch: int, tokens: int, context: int, max_seq_len: int):
    program = lowered_step(model, recipe, batch=batch, tokens=tokens, context=context,
                           max_seq_len=max_seq_len)  # fmt: skip
    sig = program.graph_signature
    frac, assumption = expert_fraction(model, batch * tokens)
    rows, per_version = step_costs(
        program.graph_module, params=set(sig.inputs_to_parameters),
        caches=set(sig.user_inputs[3:]), context=context, expert_fraction=frac,
    )  # fmt: skip
    return rows, per_version, assumption


def step_cost(model, note: str, *, batch: int, context: int, recipe: str,
              max_seq_len: int | None = None) -> dict:  # fmt: skip
    """The cost model's object for one (model, batch, context, recipe): the decode step's totals
    and rows, the prefill's totals, the work done once per weight version."""
    if batch < 1 or context < 1:
        raise ValueError(f"batch and context must be >= 1, got {batch} and {context}")
    slots = context if max_seq_len is None else max_seq_len
    if slots < context:
        raise ValueError(f"max_seq_len ({slots}) must be >= context ({context})")
    shapes = dict(batch=batch, context=context, max_seq_len=slots)
    rows, per_version, assumption = phase_cost(model, recipe, tokens=1, **shapes)
    pre_rows, _, pre_assumption = phase_cost(model, recipe, tokens=context, **shapes)
    return {
        "model": note,
        "recipe": recipe,
        "batch": batch,
        "context": context,
        "max_seq_len": slots,
        **summarize(rows),
        "assumptions": [assumption, "decode: 1 new token per sequence, L = context keys"],
        "per_op": [r.to_dict() for r in rows],
        "by_op": by_op(rows),
        "prefill": {
            **summarize(pre_rows),
            "tokens_per_sequence": context,
            "assumption": pre_assumption,
            "by_op": by_op(pre_rows)[:5],
        },  # fmt: skip
        "per_weight_version": summarize(per_version),
        "constants": constants(),
    }


def summarize(rows: list[OpCost]) -> dict:
    """A step's totals (launches, bytes, FLOPs, roofline) over its rows."""
    return {
        "launches": sum(r.launches for r in rows),
        "launches_eager": sum(
            len(r.nodes) if r.op.startswith("fused") else r.launches for r in rows
        ),  # fmt: skip
        "bytes": sum(r.bytes for r in rows),
        "bytes_read": sum(r.bytes_read for r in rows),
        "bytes_written": sum(r.bytes_written for r in rows),
        "flops": sum(r.flops for r in rows),
        "roofline_ms": sum(r.roofline_us for r in rows) / 1e3,
        "kv_cache_copy_bytes": sum(r.bytes for r in rows if r.copies_kv_cache),
    }


def by_op(rows: list[OpCost]) -> list[dict]:
    """Rows summed per op name, most bytes first."""
    agg: dict[str, dict] = {}
    for r in rows:
        a = agg.setdefault(r.op, {"op": r.op, "count": 0, "launches": 0, "bytes": 0, "flops": 0,
                                  "roofline_us": 0.0, "kv_cache": r.kv_cache})  # fmt: skip
        a["count"] += 1
        a["launches"] += r.launches
        a["bytes"] += r.bytes
        a["flops"] += r.flops
        a["roofline_us"] += r.roofline_us
    return sorted(agg.values(), key=lambda a: -a["bytes"])


def constants() -> dict:
    return {
        "copy_bytes_per_s": COPY_BYTES_PER_S,
        "copy_source": "benchmarks/results/2026-12-05_decode_gemm_20848a7.md",
        "bf16_flops_per_s": BF16_FLOPS_PER_S,
        "bf16_source": "benchmarks/results/2026-12-02_gemm.md",
    }


def text_report(res: dict) -> str:
    out = [
        f"{res['model']}; recipe {res['recipe']}, batch {res['batch']}, context {res['context']} "
        f"of {res['max_seq_len']} cache slots (cost model: shapes only, no kernel ran)",
        *[f"  assumption: {a}" for a in res["assumptions"]],
        f"decode step: {res['launches']} launches ({res['launches_eager']} eager), "
        f"{res['bytes'] / 1e6:.2f} MB, {res['flops'] / 1e9:.2f} GFLOP, roofline "
        f"{res['roofline_ms'] * 1e3:.1f} us; KV-cache copies {res['kv_cache_copy_bytes'] / 1e6:.2f} MB",
        f"prefill ({res['context']} tokens/seq): {res['prefill']['launches']} launches, "
        f"{res['prefill']['bytes'] / 1e6:.1f} MB, roofline {res['prefill']['roofline_ms']:.3f} ms",
        "",
        f"{'op':<48} {'n':>4} {'launch':>6} {'MB':>9} {'GFLOP':>8} {'roof us':>8}  kv cache",
    ]
    for a in res["by_op"]:
        out.append(f"{a['op'][:48]:<48} {a['count']:>4} {a['launches']:>6} "
                   f"{a['bytes'] / 1e6:>9.3f} {a['flops'] / 1e9:>8.3f} "
                   f"{a['roofline_us']:>8.2f}  {a['kv_cache']}")  # fmt: skip
    return "\n".join(out)


# The committed tables (`--all`): both benchmark models x batch 1 / 16 / 64 / 256 x recipes
# strict / bf16 / stock at context 512 (the rollout benchmark's cache: prompt 256 + 256 new
# tokens = 512 slots), written as benchmarks/results/<date>_step_cost_<commit>.{md,json}.
REPORT_BATCHES = (1, 16, 64, 256)
REPORT_CONTEXT = 512


def _short_op(op: str) -> str:
    return op.removeprefix("fp4_compile.").removeprefix("aten.")


def _top5(res: dict) -> str:
    return "; ".join(f"{_short_op(a['op'])} x{a['count']} {a['bytes'] / 1e6:.0f}"
                     for a in res["by_op"][:5])  # fmt: skip


def _row(res: dict) -> str:
    pre = res["prefill"]
    return (
        f"| {res['recipe']} | {res['batch']} | {res['launches']} ({res['launches_eager']}) | "
        f"{res['bytes'] / 1e6:.1f} | {res['kv_cache_copy_bytes'] / 1e6:.1f} | "
        f"{res['flops'] / 1e9:.2f} | {res['roofline_ms'] * 1e3:.1f} | "
        f"{pre['launches']} | {pre['bytes'] / 1e6:.0f} | {pre['roofline_ms']:.2f} | {_top5(res)} |"
    )


def write_all(batches=REPORT_BATCHES, context: int = REPORT_CONTEXT) -> list:
    env = environment()
    env["python"] = platform.python_version()
    runs, md = [], []
    md += [
        f"# Rollout step cost model, commit {env['commit']}, torch {env['torch']}",
        "",
        "Cost-model figures: computed on the CPU from the lowered graphs' shapes (meta tensors); "
        "no kernel ran. Roofline on the H200: max(bytes / copy rate, FLOPs / BF16 peak) per op, "
        f"summed; copy rate {constants()['copy_bytes_per_s'] / 1e12:.3f} TB/s "
        f"(`{constants()['copy_source']}`), BF16 peak "
        f"{constants()['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s (`{constants()['bf16_source']}`). "
        "Rules: `benchmarks/step_cost_rules.py`; guide: docs/step_cost.md. Regenerate with "
        "`python -m benchmarks.step_cost --all`.",
        "",
        f"Decode = one new token per sequence attending to L = {context} keys in a static cache "
        f"of S = {context} slots (the rollout benchmark's: prompt 256 + 256 new tokens); "
        f"prefill = a {context}-token prompt per sequence. MoE expert weights are counted for the "
        "experts a step touches, E*(1-(1-k/E)^T) of E for T tokens (uniform routing). Quantized "
        "weights come from the engine's weight store (once per weight version, not counted).",
        "",
        "Columns: launches (eager: one per op, no fusion); MB read + written per decode step; "
        "of which KV-cache copies (transformers' repeat_kv in stock: K and V per query head over "
        "the whole static cache; none in strict / bf16, whose attention reads the KV heads in "
        "place); GFLOP; "
        "roofline us; prefill launches / MB / roofline ms; top-5 ops of the decode step by MB "
        "(xN = that many calls).",
    ]
    for spec in BUILTIN_NOTES:
        model, note = build_model(spec)
        md += ["", f"## {spec}", "", note, "",
               "| recipe | batch | launches (eager) | MB | KV copy MB | GFLOP | roofline us | "
               "prefill launches | prefill MB | prefill roofline ms | top-5 ops by MB |",
               "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for recipe in RECIPES:
            for batch in batches:
                res = step_cost(model, note, batch=batch, context=context, recipe=recipe)
                print(f"{spec} {recipe} batch {batch}: {res['roofline_ms'] * 1e3:.1f} us",
                      flush=True)  # fmt: skip
                md.append(_row(res))
                res.pop("per_op")
                runs.append({"model_name": spec, **res})
        for a in runs[-1]["assumptions"][:1]:
            md.append(f"\nAssumption at batch {batches[-1]}: {a}")
        del model
        torch._dynamo.reset()
    md.append("")
    md.append(
        "Per-op rows (every kernel, its bytes, FLOPs, and whether it reads the whole static "
        "cache or the filled length): `python -m benchmarks.step_cost --model NAME --batch B "
        "--context 512 --recipe R --json`."
    )
    payload = {"env": env, "constants": constants(), "context": context, "runs": runs}
    return write_results("step_cost", payload, "\n".join(md) + "\n")


def model_arguments(parser: argparse.ArgumentParser, *, batch: int) -> None:
    """The arguments the rollout and learner cost models share."""
    parser.add_argument("--model", help=f"built-in {sorted(BUILTIN_NOTES)}, config.json or folder")
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--recipe", choices=RECIPES, default="strict")
    parser.add_argument("--layers", type=int, default=None, help="override the layer count")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--all", action="store_true", help="write the committed result files")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    model_arguments(parser, batch=1)
    parser.add_argument("--context", type=int, default=512, help="keys per sequence (L)")
    parser.add_argument("--max-seq-len", type=int, default=None, help="cache slots (S), default L")
    args = parser.parse_args(argv)
    if args.all:
        for path in write_all():
            print(path)
        return
    if not args.model:
        parser.error("--model is required (or --all)")
    model, note = build_model(args.model, layers=args.layers)
    res = step_cost(model, note, batch=args.batch, context=args.context, recipe=args.recipe,
                    max_seq_len=args.max_seq_len)  # fmt: skip
    if args.json:
        json.dump(res, sys.stdout, indent=1)
        print()
    else:
        print(text_report(res))


if __name__ == "__main__":
    main()
