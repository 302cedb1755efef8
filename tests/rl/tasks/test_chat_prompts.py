"""Prompts through the checkpoint's chat template, with a system turn (`system_prompt`), and the
trainer's rewards from the answers extracted from the completions.

Contracts, exact: with a chat template a prompt is the template's rendering of [system, user]
with the generation prompt (system left out for ""), and `system_prompt=None` is the task's own
(the reasoning-gym families' <answer> instruction; none for the built-in tasks); a system prompt
where no chat template can render it (the built-in character tokenizer, a checkpoint without a
template) is a ValueError naming `system_prompt`; the system prompt is part of the tokenizer's
identity (checkpoints, warm-start cache). In a GRPO step (eager, a scripted rollout of
hand-written completions that reason, then answer, then EOS) each reward is the verifier's score
of the extracted answer, `reward/exact_frac` counts extracted answers, the loss mask covers each
completion up to and including its EOS, and the learner's width is the longest sequence's bucket,
not prompt + max_new_tokens."""

import importlib.util

import pytest
import torch
from model_dirs import PRINTABLE, SYSTEM_TEMPLATE, save_tokenizer

from fp4_compile.rl.tasks.builtin import make_task
from fp4_compile.rl.tasks.tokenizer import make_tokenizer
from fp4_compile.rl.train.batching import learner_width
from fp4_compile.rl.train.config import TrainConfig, derive_seed
from fp4_compile.rl.train.presets import get_preset
from fp4_compile.rl.train.trainer import GRPOTrainer
from fp4_compile.rollout.engine import RolloutOutput

needs_extra = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("reasoning_gym", "math_verify")),
    reason="needs the optional extra minite[tasks] (reasoning-gym, math-verify)",
)


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    """A 1-layer Qwen3 (vocab 112) with a printable-ASCII character tokenizer whose chat template
    renders a system turn as "sys:TEXT\\n" and the user turn as "q:TEXT", then " a:"."""
    from fp4_compile.models import tiny_causal_lm

    folder = tmp_path_factory.mktemp("chat_model")
    torch.manual_seed(0)
    tiny_causal_lm("qwen3", layers=1, vocab=112).save_pretrained(str(folder))
    save_tokenizer(folder, chat_template=SYSTEM_TEMPLATE, characters=PRINTABLE)
    return folder


@needs_extra
def test_system_and_user_turns_through_the_chat_template(chat_model_dir):
    from fp4_compile.rl.tasks.reasoning_gym import SYSTEM_PROMPT

    rg = make_task("rg:chain_sum", num_digits=2)
    question = rg.problems(1, seed=0)[0].prompt
    tok = make_tokenizer(str(chat_model_dir), rg)  # None: the task's own system prompt
    ids = tok.encode_prompt(question)
    assert tok.system_prompt == SYSTEM_PROMPT and "<answer></answer>" in SYSTEM_PROMPT
    assert tok.decode(ids) == f"sys:{SYSTEM_PROMPT}\nq:{question} a:"
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
    assert ids == tok.hf.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    own = make_tokenizer(str(chat_model_dir), rg, system_prompt="Answer fast.")
    assert own.decode(own.encode_prompt(question)) == f"sys:Answer fast.\nq:{question} a:"
    none = make_tokenizer(str(chat_model_dir), rg, system_prompt="")
    assert none.decode(none.encode_prompt(question)) == f"q:{question} a:"
    # the built-in tasks have no system prompt of their own
    sort = make_tokenizer(str(chat_model_dir), make_task("sort", num_digits=3))
    assert sort.decode(sort.encode_prompt("s:314>")) == "q:s:314> a:"
    # the system prompt is part of the tokenizer's identity; "" keeps the identity it had
    assert len({tok.to_dict()["sha256"], own.to_dict()["sha256"], none.to_dict()["sha256"]}) == 3
    assert none.to_dict() == sort.to_dict()


def test_system_prompt_without_a_chat_template_is_refused(tmp_path):
    task = make_task("sort", num_digits=3)
    for ok in (None, ""):
        assert make_tokenizer("", task, system_prompt=ok).encode_prompt("s:1>")[1:] != []
    with pytest.raises(ValueError, match="system_prompt"):
        make_tokenizer("", task, system_prompt="Think first.")
    save_tokenizer(tmp_path, chat_template=None)
    with pytest.raises(ValueError, match="system_prompt"):
        make_tokenizer(str(tmp_path), task, system_prompt="Think first.")
    assert make_tokenizer(str(tmp_path), task).system_prompt == ""


def test_system_prompt_setting_parses():
    cfg = TrainConfig()
    assert cfg.system_prompt is None
    assert cfg.with_overrides(["system_prompt=Think, then answer."]).system_prompt == (
        "Think, then answer."
    )
    assert cfg.with_overrides(["system_prompt="]).system_prompt == ""
    assert cfg.with_overrides(["system_prompt=none"]).system_prompt is None
    with pytest.raises(ValueError, match="system_prompt"):
        TrainConfig(system_prompt=3)


@needs_extra
def test_rewards_come_from_the_extracted_answers(tmp_path, chat_model_dir):
    over = dict(
        model=chat_model_dir,
        task="rg:chain_sum",
        steps=1,
        prompts_per_step=2,
        group_size=4,
        warm_start_steps=0,
        max_new_tokens=48,
        eval_every=0,
        compile=False,
        partial_credit=0,
        system_prompt="Answer in <answer></answer>.",
        out_dir=tmp_path / "run",
        cache_dir=tmp_path / "cache",
    )
    cfg = get_preset("tiny-rg").with_overrides([f"{k}={v}" for k, v in over.items()])
    trainer = GRPOTrainer(cfg, log=lambda *_: None)
    tok = trainer.tok
    problems = trainer.task.problems(2, seed=derive_seed(cfg.seed, "prompts", 0))  # step 0's

    def completions_for(p):
        right, wrong = p.answer, str(int(p.answer) + 1)
        return [
            f"It is {right}.\n<answer>{right}</answer>",  # reasons, answers right: 1
            f"Maybe {right}?\n<answer>{wrong}</answer>",  # right number inside, wrong answer: 0
            f"{wrong}\n{right}",  # no tags, the last line is right: 1
            "I do not know.",  # no answer: 0
        ]

    script = [c for p in problems for c in completions_for(p)]

    def scripted_generate(prompts, *, max_new_tokens, eos_token_id, **_):
        assert max_new_tokens == 48 and len(prompts) == len(script)
        tokens = [tok.hf.encode(c, add_special_tokens=False) + [eos_token_id] for c in script]
        assert all(len(t) <= max_new_tokens for t in tokens)
        logps = [torch.zeros(len(t)) for t in tokens]
        return RolloutOutput(tokens=tokens, logprobs=logps, finish_reasons=["eos"] * len(tokens))

    trainer.engine.generate = scripted_generate
    captured = {}
    pack = trainer._pack

    def spy_pack(prompts, out):
        captured["batch"] = pack(prompts, out)
        return captured["batch"]

    trainer._pack = spy_pack
    record = trainer.train_step()
    rollout = trainer.last_rollout
    assert tok.decode(rollout["prompts"][0]).startswith("sys:Answer in <answer></answer>.\nq:")
    assert [p.prompt for p in rollout["problems"]] == [p.prompt for p in problems]
    assert rollout["completions"] == script
    assert rollout["rewards"] == [1.0, 0.0, 1.0, 0.0] * 2
    assert record["reward/mean"] == 0.5 and record["reward/exact_frac"] == 0.5
    # the loss mask: each completion up to and including its EOS, nothing of the padding
    ids, mask, _ = captured["batch"]
    lengths = [len(t) for t in tok.hf(script, add_special_tokens=False)["input_ids"]]
    assert mask.sum(1).tolist() == [n + 1 for n in lengths]
    longest = max(len(p) + n + 1 for p, n in zip(rollout["prompts"], lengths))
    assert ids.shape[1] == record["perf/learner_width"] == learner_width(longest, trainer.width)
    assert ids.shape[1] < trainer.width == trainer.max_prompt_tokens + 48
    assert (record["rollout/min_new_tokens"], record["rollout/max_new_tokens"]) == (
        min(lengths) + 1,
        max(lengths) + 1,
    )
