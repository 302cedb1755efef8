#!/usr/bin/env bash
# Issue 31's GPU calls. STAGE=sweep: the decode GEMM figures and its tile sweep (each config
# checked bitwise against the learner's GEMM first; SWEEP_ONLY=weights_right (default): the
# learner-orientation candidates only, the others were swept in 2026-12-05_decode_gemm_20848a7);
# STAGE=rollout: the decode CUDA tests and alignment, then rollout tokens/s with CUDA graphs;
# STAGE=profile: where a decode step's GPU time goes at batch 1 and 64, strict vs the bf16 recipe.
#   MINITE_COMMIT=<sha> STAGE=sweep|rollout|profile bash benchmarks/gpu_decode_session.sh
set -u
export PYTHONUNBUFFERED=1
C="${MINITE_COMMIT:-unknown}"
D="$(date +%F)"
run() { local t=$1 name=$2; shift 2; local log="$OUT/${D}_${name}_${C:0:7}.log"; echo "== $name"; timeout "$t" "$@" > "$log" 2>&1; echo "rc=$? $name"; tail -5 "$log"; }
if [ "${STAGE:-sweep}" = sweep ]; then
  run "${DECODE_S:-540}" decode_gemm python3 -m benchmarks.decode_gemm --sweep --sweep-only "${SWEEP_ONLY:-weights_right}"
elif [ "$STAGE" = profile ]; then
  run "${PROFILE_S:-300}" rollout_profile python3 -m benchmarks.rollout --configs "minite strict NVFP4;minite bf16 recipe" --batches 1,64 --profile-batch 1,64 --skip-hf --name rollout_profile
else
  run "${PYTEST_S:-200}" pytest_gpu_decode python3 -m pytest -q -m "gpu and not slow" tests/gpu/test_gpu_decode_gemm.py tests/codegen/nvfp4/test_decode_gemm.py tests/gpu/test_gpu_alignment.py
  run "${ROLLOUT_S:-300}" rollout python3 -m benchmarks.rollout --configs "minite strict NVFP4;minite bf16 recipe" --skip-hf --name rollout_decode
fi
