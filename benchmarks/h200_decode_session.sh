#!/usr/bin/env bash
# The decode GPU session: correctness first (decode GEMM == learner GEMM, the NVFP4 kernels with
# shared weight scales, learner == rollout alignment), then the decode GEMM and rollout figures.
# Logs (<date>_<topic>_<commit>.log) and results land under $OUT (at most 8 files come back).
#   MINITE_COMMIT=<sha> bash benchmarks/h200_decode_session.sh
set -u
export PYTHONUNBUFFERED=1
C="${MINITE_COMMIT:-unknown}"
D="$(date +%F)"
run() { local t=$1 name=$2; shift 2; local log="$OUT/${D}_${name}_${C:0:7}.log"; echo "== $name"; timeout "$t" "$@" > "$log" 2>&1; echo "rc=$? $name"; tail -5 "$log"; }
run "${PYTEST_S:-180}" pytest_gpu_decode python3 -m pytest -q -m "gpu and not slow" tests/gpu/test_gpu_decode_gemm.py tests/gpu/test_gpu_nvfp4.py tests/codegen/nvfp4/test_decode_gemm.py tests/gpu/test_gpu_alignment.py
run "${DECODE_S:-100}" decode_gemm python3 -m benchmarks.decode_gemm
run "${ROLLOUT_S:-220}" rollout python3 -m benchmarks.rollout --configs minite-graphs --skip-hf --name rollout_h200_decode
