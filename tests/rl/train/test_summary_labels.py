"""The run summary (rl/train/run_log.summary) labels each learner/rollout mismatch metric with the
value identical engines give, so a perfect `token_mult_prob_error` of 1 does not read as an
error, and reports the worst end of each (min for the bitwise-equal fraction)."""

from fp4_compile.rl.train.run_log import summary


def test_mismatch_lines_say_what_identical_is():
    records = [
        {
            "step": s,
            "reward/mean": 0.5,
            "reward/exact_frac": 0.1,
            "perf/step_s": 1.0,
            "mismatch/max_abs_dlogp": 0.0,
            "mismatch/frac_bitwise_equal": f,
            "rollout_corr/k3_kl": 0.0,
            "token_mult_prob_error": 1.0,
        }
        for s, f in ((0, 1.0), (1, 0.5), (2, 1.0))
    ]
    lines = summary(records, title="t").splitlines()
    tmpe = next(line for line in lines if line.startswith("token_mult_prob_error"))
    assert tmpe.startswith("token_mult_prob_error (1 = identical)"), tmpe
    frac = next(line for line in lines if line.startswith("mismatch/frac_bitwise_equal"))
    assert "(1 = identical)" in frac and "min over run: 0.5" in frac, frac
    dlogp = next(line for line in lines if line.startswith("mismatch/max_abs_dlogp"))
    assert "(0 = identical)" in dlogp and "max over run: 0" in dlogp, dlogp
