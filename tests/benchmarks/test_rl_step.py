"""benchmarks.rl_step's report (CPU, synthetic figures; the benchmark itself runs minutes)."""

import argparse

from benchmarks.rl_step import PHASES, report


def _result(scale: float, equal: int) -> dict:
    phase = {p: scale * (i + 1) for i, p in enumerate(PHASES)}
    return {
        "first_step_s": phase,
        "phase_s": phase,
        "step_s": sum(phase.values()),
        "generated_tokens": 100,
        "learner_eq_rollout_rows": [equal, equal],
        "requests": 8,
    }


def test_report_ratio_tokens_per_s_and_bitwise_rows():
    args = argparse.Namespace(
        model="tiny-qwen3",
        layers=2,
        prompts=2,
        group=4,
        prompt=16,
        budget=32,
        median_frac=0.125,
        sigma=1.0,
        max_batch=8,
        steps=2,
    )
    env = {"gpu": "GPU", "torch": "t", "triton": "tr", "commit": "c"}
    text = report({"strict": _result(0.5, 8), "stock": _result(1.0, 0)}, args, env)
    strict = next(line for line in text.splitlines() if line.startswith("| strict "))
    cells = [c.strip() for c in strict.split("|")[1:-1]]
    assert cells[5] == "5.000" and cells[6] == "2.00x"  # step 0.5+1+1.5+2; stock's 10 / 5
    assert cells[7] == "200"  # 100 tokens / 0.5 s of rollout
    assert cells[8] == "8 / 8"
