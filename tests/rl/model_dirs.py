"""Local transformers checkpoint folders for `model=DIR` tests, built here with `save_pretrained`
from configs (no downloads): a tiny model of any family and a character tokenizer with a chat
template."""

from __future__ import annotations

from pathlib import Path

import torch

from fp4_compile.rl.tokenizer import CHARACTERS

TEMPLATE = (
    "{% for m in messages %}q:{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %} a:{% endif %}"
)


def save_tokenizer(folder, *, chat_template=TEMPLATE):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<bos>", "<eos>", *CHARACTERS])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one per character
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
