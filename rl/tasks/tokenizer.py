"""The tokenizer interface of the RL trainer and warm start (`Tokenizer`), and its built-in
implementation: a tiny character tokenizer that ships in the repo (digits, the few symbols the
tasks use, three special tokens). No files, no downloads; the vocabulary is fixed, so token ids
are stable across versions (changing it changes `VOCAB_VERSION`, which checkpoints record). A
task whose alphabet is larger (the reasoning-gym tasks) gets the characters it lacks appended,
sorted, after the built-in ones: the built-in ids never move, and `to_dict()` lists every token.
The other implementation, `rl/tasks/hf_tokenizer.py`, adapts a transformers checkpoint's tokenizer.

    tok = CharTokenizer()
    ids = tok.encode("12+34=")          # [BOS, '1', '2', '+', '3', '4', '=']
    tok.decode(ids)                     # "12+34=" (special tokens dropped)
"""

from __future__ import annotations

from typing import Protocol

from .builtin import Task
from .hf_tokenizer import HFTokenizer

VOCAB_VERSION = 1
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
CHARACTERS = "0123456789+=,:>-| " + "abcdefghijklmnopqrstuvwxyz"


class Tokenizer(Protocol):
    """What the trainer and the warm start need from a tokenizer.

    A prompt is encoded once, whole (BOS, chat template: whatever the tokenizer's model expects
    before an answer); an answer is its ids plus `eos_id`, the token that ends a rollout.
    `token_budget(task)` gives the two numbers that fix the one padded batch width (so the
    compiled learner sees one shape): every prompt of `task` encodes to at most
    `max_prompt_tokens` ids and every answer (with its EOS) to at most `max_answer_tokens`.
    `to_dict()` identifies the tokenizer in checkpoints (a resumed run must use the same one).
    """

    pad_id: int
    eos_id: int
    system_prompt: str
    """The system turn every prompt starts with ("" = none; only a chat template renders one)."""

    @property
    def vocab_size(self) -> int:
        """Ids 0..vocab_size-1 are real tokens; the model's embedding must have at least as many
        rows."""
        ...

    def encode_prompt(self, prompt: str) -> list[int]: ...

    def encode_answer(self, answer: str) -> list[int]: ...

    def decode(self, ids: list[int], *, stop_at_eos: bool = True) -> str: ...

    def token_budget(self, task: Task) -> tuple[int, int]:
        """-> (max_prompt_tokens, max_answer_tokens incl. EOS) over every problem of `task`."""
        ...

    def to_dict(self) -> dict: ...


def make_tokenizer(
    model: str = "", task: Task | None = None, *, system_prompt: str | None = None
) -> Tokenizer:
    """The run's tokenizer: the built-in `CharTokenizer` (extended by `task.alphabet`), or for
    `model=DIR` that checkpoint's own (`HFTokenizer`), whose chat template renders the system
    turn `system_prompt` (None: `task.system_prompt`; "": none) before every prompt. A system
    prompt needs a chat template: text given for a tokenizer without one is a ValueError."""
    if system_prompt is not None and not isinstance(system_prompt, str):
        raise TypeError(f"system_prompt must be a str or None, got {system_prompt!r}")
    if model:
        tok = HFTokenizer(model)
        if system_prompt is None:
            system_prompt = task.system_prompt if task is not None and tok.chat_template else ""
        tok.set_system_prompt(system_prompt)
        return tok
    if system_prompt:
        raise ValueError(
            f"system_prompt={system_prompt!r} needs a chat template; the built-in character "
            "tokenizer (model='') has none: its prompts are the question alone (set "
            "system_prompt='' or leave it unset, or train a model=DIR checkpoint)"
        )
    return CharTokenizer(extra_characters=task.alphabet if task is not None else "")


class CharTokenizer:
    """One token per character of `CHARACTERS`; ids 0..2 are <pad>, <bos>, <eos>.

    `vocab_size` is the number of real tokens; `padded_vocab_size(multiple)` rounds it up for the
    model's embedding (GEMM tiles want a multiple of 16). Ids past `vocab_size` never decode.
    `extra_characters`: a task's alphabet; the characters `CHARACTERS` lacks get the next ids.
    """

    def __init__(self, *, extra_characters: str = "") -> None:
        if not isinstance(extra_characters, str):
            raise TypeError(f"extra_characters must be a str, got {extra_characters!r}")
        extra = sorted(set(extra_characters) - set(CHARACTERS))
        self.characters = CHARACTERS + "".join(extra)
        self.tokens: tuple[str, ...] = SPECIAL_TOKENS + tuple(self.characters)
        self._to_id = {t: i for i, t in enumerate(self.tokens)}
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2
        self.system_prompt = ""  # no chat template: a prompt is the question alone

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def padded_vocab_size(self, multiple: int = 16) -> int:
        if not isinstance(multiple, int) or multiple < 1:
            raise ValueError(f"multiple must be a positive int, got {multiple!r}")
        return -(-self.vocab_size // multiple) * multiple

    def encode(self, text: str, *, bos: bool = True, eos: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        ids = []
        for pos, ch in enumerate(text):
            if ch not in self._to_id or ch in SPECIAL_TOKENS:
                raise ValueError(
                    f"character {ch!r} at position {pos} of {text!r} is not in the vocabulary "
                    f"{self.characters!r}"
                )
            ids.append(self._to_id[ch])
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def encode_prompt(self, prompt: str) -> list[int]:
        return self.encode(prompt)

    def encode_answer(self, answer: str) -> list[int]:
        return self.encode(answer, bos=False, eos=True)

    def token_budget(self, task: Task) -> tuple[int, int]:
        """Exact: one token per character, plus BOS before a prompt and EOS after an answer."""
        return 1 + task.max_prompt_chars, task.max_answer_chars + 1

    def decode(self, ids: list[int], *, stop_at_eos: bool = True) -> str:
        """Characters of `ids`, special tokens dropped; stops at the first <eos> by default.
        Ids outside the vocabulary (the padded rows of the embedding) decode as '?' so a
        verifier sees them as wrong, never as a crash."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.eos_id and stop_at_eos:
                break
            if i < len(SPECIAL_TOKENS):
                continue
            out.append(self.tokens[i] if i < self.vocab_size else "?")
        return "".join(out)

    def to_dict(self) -> dict:
        return {"kind": "char", "vocab_version": VOCAB_VERSION, "tokens": list(self.tokens)}
