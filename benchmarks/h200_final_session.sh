#!/usr/bin/env bash
# The session's last GPU call: learner == rollout alignment (strict, batches 1 / 8 / 64) and the
# fusion checks on the merged tree, then the decode GEMM figures (CUDA-graph timing).
#   MINITE_COMMIT=<sha> bash benchmarks/h200_final_session.sh
set -u
export PYTHONUNBUFFERED=1
C="${MINITE_COMMIT:-unknown}"
D="$(date +%F)"
run() { local t=$1 name=$2; shift 2; local log="$OUT/${D}_${name}_${C:0:7}.log"; echo "== $name"; timeout "$t" "$@" > "$log" 2>&1; echo "rc=$? $name"; tail -4 "$log"; }
run "${ALIGN_S:-170}" pytest_alignment python3 -m pytest -q -m "gpu and not slow" tests/gpu/test_gpu_alignment.py
run "${FUSION_S:-80}" pytest_fusion python3 -m pytest -q -m gpu tests/gpu/test_gpu_fusion.py
run "${DECODE_S:-70}" decode_gemm python3 -m benchmarks.decode_gemm
