#!/usr/bin/env bash
# The model-level GPU session: kernel tests, learner, learner == rollout alignment, rollout speed.
# Results (md + json) and logs are packed into $OUT/session.tgz.
#   MINITE_COMMIT=<sha> bash benchmarks/h200_rollout_session.sh
set -u
R="${OUT:-/tmp/out}/r"
mkdir -p "$R"
export OUT="$R"
run() { local t=$1 name=$2; shift 2; echo "== $name"; timeout "$t" "$@" > "$R/$name.log" 2>&1; echo "rc=$? $name"; tail -4 "$R/$name.log"; }
run 90 pytest_nvfp4_cuda python3 -m pytest -q tests/codegen/test_nvfp4_kernels.py tests/codegen/test_nvfp4_ops.py
run 120 learner python3 -m benchmarks.learner --profile
run 100 alignment python3 -m benchmarks.alignment_gpu --batches "${ALIGN_BATCHES:-1,64}"
run 270 rollout python3 -m benchmarks.rollout --profile-batch 64
tar czf "$R/../session.tgz" -C "$R" .
rm -rf "$R"
