"""minite inside TRL's GRPOTrainer (`fp4_compile.integrations.trl`), on the CPU.

Contract (bitwise): 3 GRPO steps of a tiny Qwen3 and of a tiny Qwen3-MoE (random weights, the
character tokenizer of the tests as a transformers tokenizer) through `MiniteGRPOTrainer`, strict
recipe: at every step the learner's per-token log-probs of the generated tokens equal the
rollout engine's bit for bit (every real token, max |dlogp| exactly 0), the weights change, and
the run logs the mismatch under TRL's names (`sampling/sampling_logp_difference/*`,
`sampling/importance_sampling_ratio/*`) and minite's (`mismatch/*`). The dense run also trains
against a reference (beta != 0: its own compiled copy; KL exactly 0 at the first step, when the
reference and the policy are the same weights) with two gradient-accumulation micro-batches per
step; in both the learner's NVFP4 weights are quantized once per optimizer step (its weight
store's writes counted) and the reference's once; the MoE run adds the load-balancing loss of its
config over the real tokens. What would break the bits (TRL's default
bf16=True autocast, a temperature the engine does not sample at) is refused with the setting
named. Needs TRL (`minite[trl]`); the module is skipped, with the reason, without it."""

import os

import pytest
import torch

pytest.importorskip("trl", reason="needs TRL: pip install 'minite[trl]'")

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is TRL-experimental

from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl import GRPOConfig  # noqa: E402

from fp4_compile.integrations.trl import TRL_METRIC_NAMES, MiniteGRPOTrainer  # noqa: E402
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe  # noqa: E402
from fp4_compile.rl.tasks.tokenizer import CHARACTERS  # noqa: E402
from fp4_compile.testing import assert_bitwise_equal  # noqa: E402

# equal-length prompts: the engine's prefill compiles once
PROMPTS = ["s:314>", "s:529>", "s:861>", "s:207>"]


def _tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(["<pad>", "<bos>", "<eos>", *CHARACTERS])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")  # one per character
    tk.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>"
    )


def _reward(completions, **unused):
    return [float(c.count("1") - c.count("9")) for c in completions]


def _config(tmp_path, **over):
    base = dict(
        output_dir=str(tmp_path / "out"),
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        max_steps=3,
        logging_steps=1,
        learning_rate=1e-3,
        seed=0,
        gradient_checkpointing=False,
        router_aux_loss_coef=0.0,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    return GRPOConfig(**{**base, **over})


class _Record(TrainerCallback):
    """The trainer's learner / rollout log-probs of each step's generation."""

    def __init__(self):
        self.trainer, self.steps = None, []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(dict(self.trainer.last_mismatch))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen3", "qwen3_moe"])
def test_trl_grpo_learner_equals_rollout_bitwise(tmp_path, arch):
    tok = _tokenizer()
    build = tiny_qwen3 if arch == "qwen3" else tiny_qwen3_moe
    model = build(layers=1, vocab=64, seed=1)
    model.generation_config.eos_token_id = tok.eos_token_id
    before = {k: v.clone() for k, v in model.state_dict().items()}
    # dense: against a reference; MoE: with the config's load-balancing loss (TRL's default)
    dense = arch == "qwen3"
    # dense: two gradient-accumulation micro-batches per optimizer step
    over = (
        {"beta": 0.04, "gradient_accumulation_steps": 2}
        if dense
        else {"beta": 0.0, "router_aux_loss_coef": None}
    )
    record = _Record()
    trainer = MiniteGRPOTrainer(
        model,
        reward_funcs=_reward,
        args=_config(tmp_path, **over),
        train_dataset=Dataset.from_dict({"prompt": PROMPTS * 3}),
        processing_class=tok,
        recipe="strict",
        max_prompt_length=8,
        callbacks=[record],
        # MoE: the engine keeps only its packed weights (updated in place from the learner's)
        engine_weights="bf16+packed" if dense else "packed",
    )
    record.trainer = trainer
    assert trainer.engine.weights == ("bf16+packed" if dense else "packed")
    trainer.train()

    assert len(record.steps) == 3
    for step, seen in enumerate(record.steps):
        real = seen["mask"].bool()
        assert int(real.sum()) > 0
        assert_bitwise_equal(
            seen["learner"][real], seen["rollout"][real], f"{arch} step {step} log-probs"
        )
    logs = [h for h in trainer.state.log_history if "mismatch/max_abs_dlogp" in h]
    assert len(logs) == 3, trainer.state.log_history
    for h in logs:
        assert all(name in h for name in TRL_METRIC_NAMES), sorted(h)
        assert h["mismatch/max_abs_dlogp"] == 0.0 and h["mismatch/frac_bitwise_equal"] == 1.0, h
        assert h["sampling/sampling_logp_difference/max"] == 0.0, h
        assert h["sampling/importance_sampling_ratio/min"] == 1.0, h
        assert h["sampling/importance_sampling_ratio/max"] == 1.0, h
    if dense:
        assert logs[0]["kl"] == 0.0, logs[0]
    else:
        assert all(h["aux_loss"] > 0 for h in logs), logs
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "no weight changed in 3 GRPO steps"
    # weights quantized once per optimizer step, not per learner call: written when the first
    # call created the entries, then once at the first call after steps 1 and 2 (none follows
    # step 3); the frozen reference's never again
    store = trainer.learner.minite_weight_store
    assert store.entries and store.refreshes == 2, (len(store.entries), store.refreshes)
    assert store.entry_writes == 3 * len(store.entries), store.entry_writes
    if dense:
        ref_store = trainer.ref_learner.minite_weight_store
        assert ref_store.entries and ref_store.refreshes == 0, ref_store.refreshes


@pytest.mark.parametrize(
    "over, match",
    [
        ({"bf16": True}, r"bf16=True.*bit for bit"),
        ({"bf16": None}, r"bf16=True"),  # TRL's default: bf16 unless fp16
        ({"generation_kwargs": {"temperature": 0.7}}, r"generation_kwargs"),
        ({"use_vllm": True}, r"use_vllm"),
        ({"repetition_penalty": 1.1}, r"repetition_penalty"),
    ],
)
def test_trl_refuses_what_breaks_the_bits(tmp_path, over, match):
    """Refused before anything is built, with the setting named."""
    model = tiny_qwen3(layers=1, vocab=64)
    with pytest.raises(ValueError, match=match):
        MiniteGRPOTrainer(
            model,
            reward_funcs=_reward,
            args=_config(tmp_path, **over),
            train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
            processing_class=_tokenizer(),
        )


def test_trl_refuses_attention_dropout(tmp_path):
    model = tiny_qwen3(layers=1, vocab=64)
    model.config.attention_dropout = 0.1
    with pytest.raises(ValueError, match="attention_dropout=0.1"):
        MiniteGRPOTrainer(
            model,
            reward_funcs=_reward,
            args=_config(tmp_path),
            train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
            processing_class=_tokenizer(),
        )


def test_trl_refuses_a_user_rollout_func(tmp_path):
    with pytest.raises(ValueError, match="rollout_func"):
        MiniteGRPOTrainer(
            tiny_qwen3(layers=1, vocab=64),
            reward_funcs=_reward,
            args=_config(tmp_path),
            train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
            processing_class=_tokenizer(),
            rollout_func=lambda prompts, trainer: {},
        )
