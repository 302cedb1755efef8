"""The TRL integration's learner rows (`MiniteGRPOTrainer._pack`).

Contract, exact (integer tensors): TRL's rows (prompt left-padded, completion right-padded) come
out starting at position 0, right-padded to the width bucket of the micro-batch's longest
sequence (`fp4_compile.rl.train.batching.learner_width`), not to max_prompt_length +
max_completion_length, so padding past the longest sequence costs no learner work; each
completion token's target index points at its own column. Needs TRL (skipped without it)."""

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("trl", reason="needs TRL: pip install 'minite[trl]'")

from fp4_compile.integrations.trl import MiniteGRPOTrainer  # noqa: E402
from fp4_compile.rl.train.batching import learner_width  # noqa: E402

PAD = 0


def _trl_rows(prompts, completions, prompt_cols, completion_cols):
    ids = torch.full((len(prompts), prompt_cols + completion_cols), PAD, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        ids[i, prompt_cols - len(p) : prompt_cols] = torch.tensor(p)
        attn[i, prompt_cols - len(p) : prompt_cols] = 1
        ids[i, prompt_cols : prompt_cols + len(c)] = torch.tensor(c)
        attn[i, prompt_cols : prompt_cols + len(c)] = 1
    return ids, attn


def test_rows_start_at_zero_and_stop_at_the_longest_bucket():
    full = 40 + 88  # max_prompt_length + max_completion_length
    owner = SimpleNamespace(learner_width=full, processing_class=SimpleNamespace(pad_token_id=PAD))
    prompts = [[5, 6, 7], [8, 9]]
    completions = [[11, 12, 2], [13, 14, 15, 16, 17, 2]]
    ids, attn = _trl_rows(prompts, completions, prompt_cols=4, completion_cols=6)
    ids_BW, target_BC, real_BC, real_BW = MiniteGRPOTrainer._pack(owner, ids, attn, 6)
    longest = max(len(p) + len(c) for p, c in zip(prompts, completions))
    assert ids_BW.shape == (2, learner_width(longest, full)) == (2, 16)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        seq = p + c
        assert ids_BW[i, : len(seq)].tolist() == seq
        assert ids_BW[i, len(seq) :].eq(PAD).all()
        assert real_BW[i].sum() == len(seq)
        assert real_BC[i].sum() == len(c)
        # completion token j is predicted at position len(p) - 1 + j
        for j in range(len(c)):
            assert ids_BW[i, target_BC[i, j] + 1] == c[j]
