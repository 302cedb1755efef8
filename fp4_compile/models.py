"""Random-init transformers models built from configs (no downloads): tiny ones for tests and
CPU recipes; shared by tests, benchmarks and the training presets. Needs the `hf` extra."""

from __future__ import annotations

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
    import transformers

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
