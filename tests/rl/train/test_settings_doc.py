"""docs/settings.md's table maps real names. Contract, exact: every setting the minite column names
is a `TrainConfig` field, the GRPO knobs (budget, system prompt, group, clip, aggregation,
advantage scale, KL, updates, TIS / MIS) all appear in it, and every `GRPOConfig` field the TRL
column names exists in the installed TRL (skipped without TRL)."""

import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from fp4_compile.rl.train.config import TrainConfig

DOC = Path(__file__).resolve().parents[3] / "docs" / "settings.md"
KNOBS = {
    "max_new_tokens",
    "system_prompt",
    "group_size",
    "prompts_per_step",
    "temperature",
    "clip_low",
    "clip_high",
    "aggregation",
    "advantage_scale",
    "kl_coef",
    "updates_per_batch",
    "tis_cap",
    "mis_token_bounds",
    "mis_seq_bounds",
}


def _rows() -> list[list[str]]:
    rows = []
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) == 4 and cells[0] not in ("what", "---"):
            rows.append(cells)
    return rows


def _names(cell: str) -> set[str]:
    """Backticked identifiers of a cell (`a_b`, not `"token"` values or `x.y` paths)."""
    return {n for n in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", cell)}


def test_minite_column_names_train_config_fields():
    rows = _rows()
    assert len(rows) >= 15
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {"token", "sequence", "std", "none"}
    not_settings = {"eos_token_id", "score_answer"}  # the tokenizer's, reasoning-gym's
    named = set().union(*(_names(r[1]) for r in rows)) - values - not_settings
    assert named <= fields, named - fields
    assert KNOBS <= named, KNOBS - named


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="needs TRL (extra trl)")
def test_trl_column_names_grpo_config_fields():
    from trl import GRPOConfig

    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    values = {"dapo", "grpo", "group", "none", "token_truncate", "token_mask", "sequence_mask"}
    # a MiniteGRPOTrainer argument, said so in its cell, and the class names themselves
    not_fields = {"max_prompt_length", "engine_weights", "GRPOConfig", "MiniteGRPOTrainer"}
    named = set().union(*(_names(r[2]) for r in _rows())) - values - not_fields
    assert "max_completion_length" in named and "num_generations" in named
    assert named <= fields, named - fields
