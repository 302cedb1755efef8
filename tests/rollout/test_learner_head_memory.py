"""The learner's log-prob pass at the full vocabulary (151,936) does not materialize its
[tokens x vocabulary] FP32 logits: 4 x 1024 tokens, log-probs + backward through a minite-compiled
Qwen3 (hidden 64), in a fresh process; its peak RSS during the compiled pass stays below 3/4 of the
logits' 2.32 GiB (measured 0.98 GiB at 512-row chunks; the full-logits path: 7.72 GiB, benchmarks/results/2026-12-07_learner_memory_ba32e0d.md)."""

import json
import subprocess
import sys

from benchmarks.learner_memory import SEQS, TOKENS, VOCAB


def test_full_vocabulary_pass_stays_below_its_logits():
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.learner_memory", "--child", "512"],
        capture_output=True,
        text=True,
        check=True,
    )
    run = json.loads(out.stdout.strip().splitlines()[-1])
    logits_gib = SEQS * TOKENS * VOCAB * 4 / 2**30
    assert run["finite"]
    assert run["peak_above_build_gib"] < 0.75 * logits_gib, run
