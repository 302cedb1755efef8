"""`minite train PRESET model=DIR` on a local transformers checkpoint (built here: a 1-layer
Qwen3 and a `tokenizers` character tokenizer with a chat template, both `save_pretrained`).

Contract: the run trains the checkpoint with ITS tokenizer; prompts go through its chat template
(the encoded prompt is the rendered template's tokens); EOS is its eos_token_id; under the strict
recipe through the compiled minite path, learner and rollout log-probs are equal bit for bit at
every step (max |dlogp| exactly 0, every token bitwise equal); the step checkpoint records the
model directory and the tokenizer, and --resume refuses another tokenizer; a `model=` that is not
a checkpoint directory is a ValueError naming `model`."""

import dataclasses

import pytest
import torch
from model_dirs import TEMPLATE, save_tokenizer

from fp4_compile.rl.cli.export import policy_from_checkpoint
from fp4_compile.rl.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
from fp4_compile.rl.train.presets import get_preset
from fp4_compile.rl.train.run_log import step_records
from fp4_compile.rl.train.trainer import train


@pytest.fixture(scope="module", params=["untied", "tied"])
def checkpoint_dir(request, tmp_path_factory):
    """A 1-layer Qwen3 (vocab 64 >= the tokenizer's 47), with its own lm_head or tied to the
    embedding (as Qwen3-0.6B is), and the tokenizer."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    folder = tmp_path_factory.mktemp(f"hf_checkpoint_{request.param}")
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=64,
        tie_word_embeddings=request.param == "tied",
    )
    torch.manual_seed(3)
    Qwen3ForCausalLM(config).save_pretrained(str(folder))
    save_tokenizer(folder)
    return folder


def _cfg(tmp_path, model_dir, **over):
    base = dict(
        model=model_dir,
        task="sort",
        num_digits=3,
        steps=2,
        prompts_per_step=2,
        group_size=2,
        warm_start_steps=1,
        warm_start_batch=4,
        checkpoint_every=1,
        compile=True,
        out_dir=tmp_path / "run",
        cache_dir=tmp_path / "cache",
    )
    return get_preset("tiny").with_overrides([f"{k}={v}" for k, v in {**base, **over}.items()])


@pytest.mark.slow
def test_train_hf_checkpoint_strict_gap_is_zero(tmp_path, checkpoint_dir):
    logs = []
    cfg = _cfg(tmp_path, checkpoint_dir)
    result = train(cfg, progress=False, log=logs.append)
    trainer = result["trainer"]
    assert any("architecture fields are ignored" in m for m in logs), logs
    assert type(trainer.model).__name__ == "Qwen3ForCausalLM"
    assert trainer.model.config.num_hidden_layers == 1  # the checkpoint's, not the preset's 2
    tied = trainer.model.lm_head.weight is trainer.model.get_input_embeddings().weight
    assert tied == trainer.model.config.tie_word_embeddings

    # its tokenizer and chat template: "s:3142>" is sent as "q:s:3142> a:", answers end at <eos>
    tok = trainer.tok
    prompt = tok.encode_prompt("s:314>")
    assert tok.decode(prompt) == "q:s:314> a:"
    assert prompt == tok.hf.encode("q:s:314> a:", add_special_tokens=False)
    assert tok.encode_answer("134")[-1] == tok.eos_id == tok.hf.convert_tokens_to_ids("<eos>")
    # sort 3 digits: "q:" + 6 + " a:" = 11 prompt tokens; 3 answer tokens + EOS
    assert (trainer.max_prompt_tokens, trainer.max_new_tokens, trainer.width) == (11, 4, 15)

    records = step_records(result["records"])
    assert [r["step"] for r in records] == [0, 1]
    for r in records:
        assert r["mismatch/max_abs_dlogp"] == 0.0, r
        assert r["mismatch/frac_bitwise_equal"] == 1.0, r
        assert r["sample"].startswith("q:s:") and " a:" in r["sample"], r["sample"]

    state = load_checkpoint(latest_checkpoint(tmp_path / "run" / "checkpoints"), kind="grpo")
    assert state["config"]["model"] == str(checkpoint_dir)
    assert state["model_dir"]["path"] == str(checkpoint_dir)
    assert state["tokenizer"]["kind"] == "hf" and state["tokenizer"] == tok.to_dict()
    # `minite export` rebuilds the policy from the directory and the checkpoint's weights
    policy = policy_from_checkpoint(latest_checkpoint(tmp_path / "run" / "checkpoints"))[0]
    want = trainer.model.state_dict()
    assert all(torch.equal(v, want[k]) for k, v in policy.state_dict().items())

    # resuming with another tokenizer (other chat template) in the same directory is refused
    save_tokenizer(checkpoint_dir, chat_template=TEMPLATE.replace("q:", "u:"))
    try:
        with pytest.raises(CheckpointError, match="tokenizer"):
            train(
                dataclasses.replace(cfg, steps=3), resume=True, progress=False, log=lambda *_: None
            )
    finally:
        save_tokenizer(checkpoint_dir)


@pytest.mark.parametrize("bad", ["missing", "no_config"])
def test_model_must_be_a_checkpoint_dir(tmp_path, bad):
    folder = tmp_path / bad
    if bad == "no_config":
        folder.mkdir()
    with pytest.raises(ValueError, match="model"):
        get_preset("tiny").with_overrides([f"model={folder}"])


def test_tokenizer_without_eos_is_refused(tmp_path):
    from fp4_compile.rl.tasks.hf_tokenizer import HFTokenizer

    hf = save_tokenizer(tmp_path)
    hf.eos_token = None
    hf.save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match="eos_token_id"):
        HFTokenizer(tmp_path)
