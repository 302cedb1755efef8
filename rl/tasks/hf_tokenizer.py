"""`HFTokenizer`: the `Tokenizer` interface (rl/tasks/tokenizer.py) over a local transformers
checkpoint's own tokenizer, for `minite train PRESET model=DIR`.

    tok = HFTokenizer("qwen3-0.6b")
    tok.encode_prompt("s:3142>")   # the chat template's user turn + generation prompt, tokenized
    tok.encode_answer("1234")      # the answer's ids + eos_token_id
    tok.decode(ids)                # text up to the first EOS, special tokens dropped

Prompts go through the tokenizer's chat template when it has one
(`apply_chat_template([{"role": "system", "content": system_prompt}, {"role": "user", "content":
prompt}], add_generation_prompt=True)`, the system turn left out when `system_prompt` is ""),
else through the tokenizer itself (its special tokens, e.g. BOS, included; no system turn). EOS is the
tokenizer's `eos_token_id`; a tokenizer without one is refused (a rollout could never end).
Padding uses `pad_token_id`, or EOS when there is none (padded positions are masked out).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .builtin import Task

BUDGET_SAMPLES = 4096
"""Problems drawn (seed `BUDGET_SEED`) to measure a task's token budget."""
BUDGET_SEED = 20261205


class HFTokenizer:
    def __init__(self, path: str | Path) -> None:
        # lazy: transformers is optional (the hf extra) and costs seconds at import
        from transformers import AutoTokenizer

        self.path = str(path)
        self.hf = AutoTokenizer.from_pretrained(self.path)
        if self.hf.eos_token_id is None:
            raise ValueError(
                f"the tokenizer of model={self.path!r} has no eos_token_id: a rollout could "
                "never end; set eos_token in its tokenizer_config.json"
            )
        self.eos_id = int(self.hf.eos_token_id)
        pad = self.hf.pad_token_id
        self.pad_id = self.eos_id if pad is None else int(pad)
        self.chat_template = bool(getattr(self.hf, "chat_template", None))
        self.system_prompt = ""

    def set_system_prompt(self, text: str) -> None:
        """The system turn rendered before every prompt ("" = none); needs a chat template."""
        if not isinstance(text, str):
            raise TypeError(f"system_prompt must be a str, got {text!r}")
        if text and not self.chat_template:
            raise ValueError(
                f"system_prompt={text!r} needs a chat template; the tokenizer of model="
                f"{self.path!r} has none (set system_prompt='' or add a chat_template)"
            )
        self.system_prompt = text

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    def encode_prompt(self, prompt: str) -> list[int]:
        if self.chat_template:
            messages = [{"role": "user", "content": prompt}]
            if self.system_prompt:
                messages.insert(0, {"role": "system", "content": self.system_prompt})
            ids = self.hf.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        else:
            ids = self.hf(prompt, add_special_tokens=True)["input_ids"]
        return [int(i) for i in ids]

    def encode_answer(self, answer: str) -> list[int]:
        return [int(i) for i in self.hf.encode(answer, add_special_tokens=False)] + [self.eos_id]

    def decode(self, ids: list[int], *, stop_at_eos: bool = True) -> str:
        """Text of `ids`, special tokens dropped; stops at the first EOS by default. Ids past the
        vocabulary (padded embedding rows) decode as '?' (a wrong answer, never a crash)."""
        out, run = [], []
        for i in ids:
            i = int(i)
            if i == self.eos_id and stop_at_eos:
                break
            if 0 <= i < self.vocab_size:
                run.append(i)
                continue
            out += [self._decode(run), "?"]
            run = []
        return "".join(out + [self._decode(run)])

    def _decode(self, ids: list[int]) -> str:
        if not ids:
            return ""
        return self.hf.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def token_budget(self, task: Task) -> tuple[int, int]:
        """Measured, not derived: the longest prompt and answer (+ EOS) over `BUDGET_SAMPLES`
        problems of `task` drawn with `BUDGET_SEED` (and an eighth as many of its held-out
        split), each encoded exactly as the trainer does
        (chat template included). A subword tokenizer's length for a string depends on its merges,
        so no per-character bound holds for every tokenizer; the tasks' prompts have a fixed
        format (fixed digit counts), so their encoded lengths vary little and the sample covers
        them. The trainer still checks every prompt against the width and raises if one is
        longer (never truncates)."""
        problems = task.problems(BUDGET_SAMPLES, seed=BUDGET_SEED)
        # the held-out split is a part of the problem space of its own
        problems += task.problems(BUDGET_SAMPLES // 8, seed=BUDGET_SEED, split="eval")
        prompt = max(len(self.encode_prompt(p.prompt)) for p in problems)
        answer = max(len(self.encode_answer(p.answer)) for p in problems)
        return prompt, answer

    def to_dict(self) -> dict:
        """The tokenizer's identity: where it came from and a hash of what decides its ids
        (vocabulary, special tokens, chat template)."""
        content = {
            "vocab": sorted(self.hf.get_vocab().items()),
            "special": {k: str(v) for k, v in sorted(self.hf.special_tokens_map.items())},
            "chat_template": getattr(self.hf, "chat_template", None),
        }
        if self.system_prompt:  # what every prompt starts with (absent: none, as before)
            content["system_prompt"] = self.system_prompt
        blob = json.dumps(content, sort_keys=True, default=str).encode()
        return {
            "kind": "hf",
            "path": self.path,
            "class": type(self.hf).__name__,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "sha256": hashlib.sha256(blob).hexdigest(),
        }
