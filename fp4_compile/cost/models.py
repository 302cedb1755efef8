"""The models the cost models price: built-in benchmark shapes or a transformers config, built
on the meta device (no weights are allocated)."""

from __future__ import annotations

from pathlib import Path

import torch

from ..models import qwen3_30b_a3b_layers

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
    import transformers  # an optional dependency (the hf extra)

    if spec in BUILTIN_NOTES:
        depth = BENCH_LAYERS if layers is None else layers
        full = 48 if spec == "qwen3-30b-a3b" else 36
        note = f"{BUILTIN_NOTES[spec]}; {depth} of its {full} layers"
        if spec == "qwen3-30b-a3b":
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


def model_config(model):
    """The text model's config (a multimodal config's `text_config`, else the config)."""
    return getattr(model.config, "text_config", None) or model.config
