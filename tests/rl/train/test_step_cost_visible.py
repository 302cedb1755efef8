"""What a GRPO step costs is visible while a run goes and after it (rl/train/run_log.py): the
progress line shows seconds per step and where they go (rollout, learner, with tokens/s) from the
first step on, and the summary reports the mean of each part after the compiling first step."""

import io

from fp4_compile.rl.train.run_log import ProgressBar, summary


def _record(step, step_s, rollout_s, learner_s):
    return {
        "step": step,
        "reward/mean": 0.25,
        "reward/exact_frac": 0.0,
        "mismatch/max_abs_dlogp": 0.0,
        "perf/step_s": step_s,
        "perf/rollout_s": rollout_s,
        "perf/learner_s": learner_s,
        "perf/rollout_tokens_per_s": 12.0,
        "perf/learner_tokens_per_s": 900.0,
    }


def test_progress_line_shows_the_cost_of_a_step():
    stream = io.StringIO()
    bar = ProgressBar(40, stream=stream)
    bar.update(0, _record(0, 71.4, 65.0, 6.4))  # the first step: its cost shows already
    line = stream.getvalue().strip()
    assert "71s/step: rollout 65s (12 tok/s), learner 6.40s (900 tok/s)" in line, line


def test_summary_reports_where_the_step_time_goes():
    records = [
        _record(0, 71.0, 65.0, 6.0),
        _record(1, 45.0, 40.0, 5.0),
        _record(2, 47.0, 41.0, 6.0),
    ]
    lines = {line.split()[0]: line for line in summary(records, title="t").splitlines()}
    assert "mean after step 0: 46" in lines["perf/step_s"], lines["perf/step_s"]
    assert "mean after step 0: 40.5" in lines["perf/rollout_s"], lines["perf/rollout_s"]
    assert "mean after step 0: 5.5" in lines["perf/learner_s"], lines["perf/learner_s"]
    assert "perf/eval_s" not in lines  # not evaluated: no line of nan
