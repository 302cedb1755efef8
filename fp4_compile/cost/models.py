"""The models the cost models price: built-in benchmark shapes or a transformers config, built
on the meta device (no weights are allocated)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..models import REAL_SHAPES, build_causal_lm, qwen3_30b_a3b_layers

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
    built-in name (`BUILTIN_NOTES`), a transformers config.json, or a checkpoint folder; built
    by `fp4_compile.models.build_causal_lm`. Built-ins keep the rollout benchmark's
    `BENCH_LAYERS` layers unless `layers` says otherwise."""
    if spec in BUILTIN_NOTES:
        depth = BENCH_LAYERS if layers is None else layers
        full = REAL_SHAPES[spec][3]
        note = f"{BUILTIN_NOTES[spec]}; {depth} of its {full} layers"
        if spec == "qwen3-30b-a3b":
            return qwen3_30b_a3b_layers(layers=depth, device="meta").eval(), note
        return build_causal_lm(spec, layers=depth, device="meta"), note
    if not Path(spec).exists():
        raise ValueError(
            f"--model {spec!r} is neither a built-in ({sorted(BUILTIN_NOTES)}) nor an "
            "existing config.json / checkpoint folder"
        )
    model = build_causal_lm(spec, layers=layers, device="meta")
    cfg = model_config(model)
    return model, f"{spec} ({cfg.model_type}), {cfg.num_hidden_layers} layers"


def model_config(model):
    """The text model's config (a multimodal config's `text_config`, else the config)."""
    return getattr(model.config, "text_config", None) or model.config
