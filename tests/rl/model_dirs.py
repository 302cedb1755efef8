"""Folders for the CLI tests, built here (no downloads): local transformers checkpoints for
`model=DIR` (`save_pretrained` of a tiny model of any family, a character tokenizer with a chat
template) and a run folder holding a GRPO checkpoint for `minite export`."""

from __future__ import annotations

from pathlib import Path

import torch

from fp4_compile.rl.tasks.tokenizer import CHARACTERS
from fp4_compile.rl.train.checkpoint import save_checkpoint, step_path
from fp4_compile.rl.train.config import build_model
from fp4_compile.rl.train.presets import get_preset

TEMPLATE = (
    "{% for m in messages %}q:{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %} a:{% endif %}"
)


# renders a system turn too: "sys:TEXT\nq:QUESTION a:"
SYSTEM_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}sys:{{ m['content'] }}\n"
    "{% else %}q:{{ m['content'] }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %} a:{% endif %}"
)
PRINTABLE = "".join(chr(c) for c in range(32, 127)) + "\n"
"""Every printable ASCII character and the newline: enough for reasoning-gym questions, system
prompts and completions that reason before an <answer></answer>."""


def save_tokenizer(folder, *, chat_template=TEMPLATE, characters=CHARACTERS):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<bos>", "<eos>", *characters])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    # one token per character (newlines included)
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"
    )
    hf.chat_template = chat_template
    hf.save_pretrained(str(folder))
    return hf


def save_model_dir(folder: Path, arch: str = "qwen3", *, tokenizer: bool = True) -> Path:
    """A 1-layer random-init `arch` (a fp4_compile.models family, or "gpt2") with vocab 64."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if arch == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        model = GPT2LMHeadModel(
            GPT2Config(
                vocab_size=64, n_embd=64, n_layer=1, n_head=2, bos_token_id=1, eos_token_id=2
            )
        )
    else:
        from fp4_compile.models import tiny_causal_lm

        model = tiny_causal_lm(arch, layers=1, vocab=64)
    model.save_pretrained(str(folder))
    if tokenizer:
        save_tokenizer(folder)
    return folder


def make_run(run_dir: Path, *, step: int = 30) -> Path:
    """A tiny-preset run folder holding one GRPO checkpoint (weights: the random init)."""
    cfg = get_preset("tiny")
    model = build_model(cfg, 32)
    state = {
        "step": step,
        "model": model.state_dict(),
        "recipe": cfg.recipe().to_dict(),
        "config": cfg.to_dict(),
        "tokenizer": {"chars": "0123456789"},
    }
    save_checkpoint(step_path(run_dir / "checkpoints", step), state, kind="grpo")
    return run_dir


def save_qwen3_hidden_72(folder):
    """A local Qwen3 folder whose hidden size (72) is no multiple of 16, with its tokenizer:
    its GEMMs cannot be NVFP4 (the preflight and `minite diagnose` refuse it by name)."""
    from fp4_compile.models import tiny_causal_lm

    tiny_causal_lm("qwen3", layers=1, hidden=72, vocab=64).save_pretrained(str(folder))
    save_tokenizer(folder)
    return folder
