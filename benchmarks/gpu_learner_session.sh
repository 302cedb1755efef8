#!/usr/bin/env bash
# Issue 32's GPU calls, one STAGE per device call (each under the 600 s a call may run):
#   STAGE=learner: the learner step (fused vs unfused quantization vs Inductor BF16, paired
#     rounds, CUDA graphs);
#   STAGE=checks: the fusion kernels' and the backend's GPU checks (compiled == eager lowered
#     graph, forward and every gradient);
#   STAGE=grpo: the `h200-moe` GRPO step, strict vs the bf16 variant, same seeds (GRPO_S
#     seconds per variant).
#   MINITE_COMMIT=<sha> STAGE=learner|checks|grpo bash benchmarks/gpu_learner_session.sh
set -u
export PYTHONUNBUFFERED=1
C="${MINITE_COMMIT:-unknown}"
D="$(date +%F)"
run() { local t=$1 name=$2; shift 2; local log="$OUT/${D}_${name}_${C:0:7}.log"; echo "== $name"; timeout "$t" "$@" > "$log" 2>&1; echo "rc=$? $name"; tail -4 "$log"; }
case "${STAGE:-learner}" in
  learner) run "${LEARNER_S:-540}" learner python3 -m benchmarks.learner --only-cuda-graphs --skip-ongrid-ab --rounds ${ROUNDS:-10} --round-iters 20 ${LEARNER_ARGS:-} ;;
  checks)
    run "${FUSION_S:-240}" pytest_fusion python3 -m pytest -q -m gpu tests/gpu/test_gpu_fusion.py
    run "${BACKEND_S:-300}" pytest_backend python3 -m pytest -q -m gpu -x tests/gpu/test_gpu_backend.py ;;
  grpo) run "$(( ${GRPO_S:-150} * 2 + 60 ))" grpo_step python3 -m benchmarks.grpo_variants --variants strict,bf16 --budget-s "${GRPO_S:-150}" ;;
  *) echo "unknown STAGE=${STAGE}" >&2; exit 2 ;;
esac
