"""Random-init transformers models built from configs (no downloads): tiny ones for tests and
CPU recipes; shared by tests, benchmarks and the training presets. Needs the `hf` extra."""

from __future__ import annotations

from pathlib import Path

import torch


def tiny_qwen3(
    *, layers: int = 2, hidden: int = 64, vocab: int = 128, seed: int = 0, dtype=torch.float32
):
    """The tiny Qwen3 of the tests and the CPU presets (`tiny_causal_lm("qwen3", ...)`)."""
    return tiny_causal_lm(
        "qwen3", layers=layers, hidden=hidden, vocab=vocab, seed=seed, dtype=dtype
    )


def tiny_qwen3_moe(
    *,
    layers: int = 2,
    hidden: int = 64,
    vocab: int = 128,
    experts: int = 4,
    seed: int = 0,
    dtype=torch.float32,
):
    # lazy: transformers is optional (the hf extra) and costs seconds at import
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        moe_intermediate_size=32,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=experts,
        num_experts_per_tok=2,
        max_position_embeddings=512,
    )
    torch.manual_seed(seed)
    return Qwen3MoeForCausalLM(cfg).to(dtype)


def tiny_llama(*, layers: int = 1, hidden: int = 64, vocab: int = 128, seed: int = 0):
    # lazy: transformers is optional (the hf extra) and costs seconds at import
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=512,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def qwen3_30b_a3b_layers(
    *,
    layers: int = 2,
    vocab: int = 8192,
    seed: int = 0,
    dtype=torch.bfloat16,
    device="cpu",
    dense: bool = False,
):
    """Qwen3-30B-A3B-shaped decoder layers (hidden 2048, 32 q / 4 kv heads, head_dim 128, 128
    experts, 8 active, moe_intermediate 768), random init, vocabulary reduced (default 8192).
    dense=True: the same attention with a dense MLP (intermediate 6144), a Qwen3 of that width."""
    # lazy: transformers is optional (the hf extra) and costs seconds at import
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    common = dict(
        vocab_size=vocab,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        max_position_embeddings=4096,
    )
    if dense:
        cls, cfg = Qwen3ForCausalLM, Qwen3Config(**common)
    else:
        moe = dict(moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8)
        cls, cfg = Qwen3MoeForCausalLM, Qwen3MoeConfig(**common, **moe, norm_topk_prob=True)
    torch.manual_seed(seed)
    with torch.device(device):
        model = cls(cfg)
    return model.to(dtype)


# architecture family -> (transformers config class, model class, config fields beyond the common
# tiny ones); `tiny_causal_lm` builds any of them, `tests/core/test_architectures.py` runs them all
ARCHITECTURES = {
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"head_dim": 32}),
    "llama_tied": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"head_dim": 32, "tie_word_embeddings": True},
    ),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"head_dim": 32}),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"head_dim": 32}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 32}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 32}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"pad_token_id": 0}),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {"head_dim": 32, "moe_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2},
    ),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {"num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2}),
}


def tiny_causal_lm(
    arch: str,
    *,
    layers: int = 2,
    hidden: int = 64,
    vocab: int = 128,
    seed: int = 0,
    dtype=torch.float32,
):
    """A random-init tiny causal LM of one of `ARCHITECTURES` (4 query / 2 KV heads of 32)."""
    import transformers  # lazy: transformers is optional (the hf extra) and costs seconds at import

    if arch not in ARCHITECTURES:
        raise ValueError(f"arch must be one of {sorted(ARCHITECTURES)}, got {arch!r}")
    config_name, model_name, extra = ARCHITECTURES[arch]
    common = dict(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    cfg = getattr(transformers, config_name)(**{**common, **extra})
    torch.manual_seed(seed)
    return getattr(transformers, model_name)(cfg).to(dtype)


# Real model shapes (FIELD_NOTES "Reference model shapes"): the architecture at full width and
# vocabulary, any number of layers, random init. One factory for tests, benchmarks and tools.
# (fmt: skip below: a table, one model per entry with its fields together)
REAL_SHAPES = {
    "qwen3-8b": (
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32,
             num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
             tie_word_embeddings=False),
        36,
    ),
    "qwen3-30b-a3b": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
             num_experts=128, num_experts_per_tok=8, norm_topk_prob=True,
             num_attention_heads=32, num_key_value_heads=4, head_dim=128,
             max_position_embeddings=40960, tie_word_embeddings=False),
        48,
    ),
    "qwen3-1.7b": (  # its layer shapes, head untied (tools/vllm_weight_sync.py)
        "Qwen3Config",
        "Qwen3ForCausalLM",
        dict(hidden_size=2048, intermediate_size=6144, num_attention_heads=16,
             num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
             tie_word_embeddings=False),
        28,
    ),
}  # fmt: skip
"""name -> (transformers config class, model class, config fields, the real model's layers)."""
REAL_VOCAB = 151936


def real_shape_config(name: str, *, layers: int, vocab: int = REAL_VOCAB):
    """The transformers config of a `REAL_SHAPES` model with `layers` decoder layers."""
    import transformers  # lazy: transformers is optional (the hf extra) and costs seconds at import

    if name not in REAL_SHAPES:
        raise ValueError(f"model shape must be one of {sorted(REAL_SHAPES)}, got {name!r}")
    if not isinstance(layers, int) or layers < 1:
        raise ValueError(f"layers must be a positive int, got {layers!r}")
    config_name, _, fields, _ = REAL_SHAPES[name]
    return getattr(transformers, config_name)(vocab_size=vocab, num_hidden_layers=layers, **fields)


def real_shape_model(
    name: str,
    *,
    layers: int,
    vocab: int = REAL_VOCAB,
    dtype=torch.bfloat16,
    device="cpu",
    seed: int = 0,
):
    """A random-init `REAL_SHAPES` causal LM ("qwen3-8b" dense, "qwen3-30b-a3b" MoE) at full
    width and (by default) full vocabulary, with `layers` layers, built directly on `device`
    (the meta device gives shapes without memory)."""
    import transformers  # lazy: transformers is optional (the hf extra) and costs seconds at import

    cfg = real_shape_config(name, layers=layers, vocab=vocab)
    torch.manual_seed(seed)
    with torch.device(device):
        model = getattr(transformers, REAL_SHAPES[name][1])(cfg)
    return model.to(dtype).eval()


def real_shape_note(name: str, *, layers: int, vocab: int = REAL_VOCAB) -> str:
    """One line describing a real-shape model as built (for benchmark and test reports)."""
    cfg = real_shape_config(name, layers=layers, vocab=vocab)
    experts = getattr(cfg, "num_experts", None)
    mlp = (
        f"{experts} experts top-{cfg.num_experts_per_tok}, moe_intermediate "
        f"{cfg.moe_intermediate_size}"
        if experts
        else f"intermediate {cfg.intermediate_size}"
    )
    return (
        f"{name}-shaped: hidden {cfg.hidden_size}, {cfg.num_attention_heads} q / "
        f"{cfg.num_key_value_heads} kv heads of {cfg.head_dim}, {mlp}, vocab {vocab}; "
        f"{layers} of its {REAL_SHAPES[name][3]} layers"
    )


TINY = {"tiny-qwen3": tiny_qwen3, "tiny-qwen3-moe": tiny_qwen3_moe}
"""The tiny random models by name (tests, CPU presets, `minite diagnose`)."""


def build_causal_lm(
    spec: str,
    *,
    layers: int | None = None,
    vocab: int | None = None,
    dtype=torch.bfloat16,
    device="cpu",
    seed: int = 0,
):
    """THE model factory: a random-init causal LM from `spec`, one of `TINY` (2 layers unless
    `layers`), a `REAL_SHAPES` name (full width; `layers` required; full vocabulary unless
    `vocab`), or a transformers config.json / folder holding one (its architecture with random
    weights; `layers` and `vocab` override its fields). Checkpoint WEIGHTS are loaded elsewhere
    (`from_pretrained`, `model_dir.py`)."""
    if spec in TINY:
        kwargs = {"layers": 2 if layers is None else layers, "seed": seed, "dtype": dtype}
        model = TINY[spec](**kwargs, **({} if vocab is None else {"vocab": vocab}))
        return model.to(device)
    if spec in REAL_SHAPES:
        if layers is None:
            raise ValueError(f"{spec!r}: pass layers= (the real model has {REAL_SHAPES[spec][3]})")
        return real_shape_model(
            spec, layers=layers, vocab=vocab or REAL_VOCAB, dtype=dtype, device=device, seed=seed
        )
    path = Path(spec)
    if not path.exists():
        raise ValueError(
            f"model {spec!r} is none of {sorted(TINY)}, {sorted(REAL_SHAPES)} and no existing "
            "config.json or folder holding one"
        )
    import transformers  # lazy: transformers is optional (the hf extra) and costs seconds at import

    cfg = transformers.AutoConfig.from_pretrained(str(path))
    text = getattr(cfg, "text_config", None) or cfg
    if layers is not None:
        text.num_hidden_layers = layers
    if vocab is not None:
        text.vocab_size = vocab
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    return model.to(dtype).eval()
