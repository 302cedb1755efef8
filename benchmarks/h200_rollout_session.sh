#!/usr/bin/env bash
# The model-level GPU session: kernel tests, learner, learner == rollout alignment, rollout speed.
# Results (md + json) and logs are packed into $OUT/session.tgz.
#   MINITE_COMMIT=<sha> [PARTS="pytest learner alignment rollout graphs lgraphs gaps invariant backend gradloc quantize tune tuneattn numerics"] \
#     bash benchmarks/h200_rollout_session.sh
#   GRADLOC_ARGS="--models moe,llama --recipes strict,te,bf16" picks the runs of the gradloc part;
#   the correctness parts (alignment, graphs, lgraphs, backend, numerics) run tests/gpu under pytest;
#   TUNE_ARGS="--only wgrad" picks the sections of the config sweep (TUNEATTN_ARGS: attention's);
#   PYTEST_FILES="tests/a.py tests/b.py" picks the CUDA test files.
# One device call (600 s) fits about two parts; ALIGN_MARK="gpu and not slow" skips batch 256.
# Issue 41 (the rollout engine): PARTS="graphs alignment" ALIGN_MARK="gpu and not slow", then PARTS=rollout.
set -u
R="${OUT:-/tmp/out}/r"
mkdir -p "$R"
export OUT="$R"
PARTS="${PARTS:-pytest learner alignment rollout}"
# logs are named as the result files: <date>_<topic>_<commit>.log
STAMP_DATE="$(date +%F)"; STAMP_COMMIT="${MINITE_COMMIT:-unknown}"; STAMP_COMMIT="${STAMP_COMMIT:0:7}"
run() { local t=$1 name=$2; shift 2; local log="$R/${STAMP_DATE}_${name}_${STAMP_COMMIT}.log"; echo "== $name"; timeout "$t" "$@" > "$log" 2>&1; echo "rc=$? $name"; tail -4 "$log"; }
for part in $PARTS; do
  case "$part" in
    pytest) run "${PYTEST_S:-240}" pytest_cuda python3 -m pytest -q ${PYTEST_FILES:-tests/codegen/invariant/test_attention_backward.py tests/codegen/nvfp4/test_quantize_global.py tests/codegen/nvfp4/test_abs_max.py tests/codegen/invariant/test_rms_norm_backward.py \
              tests/codegen/nvfp4/test_nvfp4_kernels.py tests/codegen/nvfp4/test_nvfp4_ops.py tests/codegen/moe/test_row_scale.py tests/rl/test_sampling.py} ;;
    learner) run "${LEARNER_S:-330}" learner python3 -m benchmarks.learner --profile ${LEARNER_ARGS:-} ;;
    alignment) run "${ALIGN_S:-300}" alignment python3 -m pytest -m "${ALIGN_MARK:-gpu}" -q tests/gpu/test_gpu_alignment.py ${ALIGN_ARGS:-} ;;
    rollout) run "${ROLLOUT_S:-420}" rollout python3 -m benchmarks.rollout --roofline benchmarks/results/2026-12-06_rollout_roofline_4193161.json ${ROLLOUT_ARGS:-} ;;
    graphs) run 200 cuda_graphs python3 -m pytest -m gpu -q tests/gpu/test_gpu_cuda_graphs.py tests/gpu/test_gpu_invariant_ops.py -k "engine or sampling or replay or in_place" ;;
    gaps) run "${GAPS_S:-200}" learner_gaps python3 -m benchmarks.learner_gaps ${GAPS_ARGS:-} ;;
    lgraphs) run "${LGRAPHS_S:-200}" learner_cuda_graphs python3 -m pytest -m gpu -q tests/gpu/test_gpu_cuda_graphs.py -k learner ;;
    invariant) run "${INV_S:-120}" invariant python3 -m benchmarks.invariant ;;
    backend) run "${BACKEND_S:-200}" backend python3 -m pytest -m gpu -q tests/gpu/test_gpu_backend.py ${BACKEND_ARGS:-} ;;
    quantize) run "${QUANT_S:-90}" quantize python3 -m benchmarks.quantize ;;
    gradloc) run "${GRADLOC_S:-150}" grad_localize python3 -m benchmarks.grad_localize_gpu ${GRADLOC_ARGS:-} ;;
    tune) run "${TUNE_S:-330}" tune_kernels python3 -m benchmarks.tune_kernels ${TUNE_ARGS:-} ;;
    tuneattn) run "${TUNEATTN_S:-300}" tune_attention python3 -m benchmarks.tune_attention ${TUNEATTN_ARGS:-} ;;
    numerics) run "${NUMERICS_S:-120}" elementwise_numerics python3 -m pytest -m gpu -q tests/gpu/test_gpu_elementwise_numerics.py ${NUMERICS_ARGS:-} ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
tar czf "$R/../session.tgz" -C "$R" .
rm -rf "$R"
