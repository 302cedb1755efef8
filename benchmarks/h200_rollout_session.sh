#!/usr/bin/env bash
# The model-level GPU session: kernel tests, learner, learner == rollout alignment, rollout speed.
# Results (md + json) and logs are packed into $OUT/session.tgz.
#   MINITE_COMMIT=<sha> [PARTS="pytest learner alignment rollout graphs lgraphs gaps invariant backend gradloc quantize tune tuneattn numerics"] \
#     bash benchmarks/h200_rollout_session.sh
#   GRADLOC_ARGS="--models moe,llama --recipes strict,te,bf16" picks the runs of the gradloc part;
#   BACKEND_ARGS="--tokens 4096" runs the backend check's 30B rows on the learner's on-grid path;
#   TUNE_ARGS="--only wgrad" picks the sections of the config sweep (TUNEATTN_ARGS: attention's);
#   PYTEST_FILES="tests/a.py tests/b.py" picks the CUDA test files.
# One device call (600 s) fits about two parts; ALIGN_BATCHES (default 1,64) picks batch sizes.
set -u
R="${OUT:-/tmp/out}/r"
mkdir -p "$R"
export OUT="$R"
PARTS="${PARTS:-pytest learner alignment rollout}"
run() { local t=$1 name=$2; shift 2; echo "== $name"; timeout "$t" "$@" > "$R/$name.log" 2>&1; echo "rc=$? $name"; tail -4 "$R/$name.log"; }
for part in $PARTS; do
  case "$part" in
    pytest) run "${PYTEST_S:-240}" pytest_cuda python3 -m pytest -q ${PYTEST_FILES:-tests/codegen/test_attention_backward.py tests/codegen/test_quantize_global.py tests/codegen/test_abs_max.py tests/codegen/test_rms_norm_backward.py \
              tests/codegen/test_nvfp4_kernels.py tests/codegen/test_nvfp4_ops.py tests/codegen/test_row_scale.py tests/rl/test_sampling.py} ;;
    learner) run "${LEARNER_S:-330}" learner python3 -m benchmarks.learner --profile ${LEARNER_ARGS:-} ;;
    alignment) run "${ALIGN_S:-300}" alignment python3 -m benchmarks.alignment_gpu --batches "${ALIGN_BATCHES:-1,64}" ${ALIGN_ARGS:-} ;;
    rollout) run "${ROLLOUT_S:-420}" rollout python3 -m benchmarks.rollout --profile-batch 64 ${ROLLOUT_ARGS:-} ;;
    graphs) run 200 cuda_graphs python3 -m benchmarks.cuda_graph_gpu_check ;;
    gaps) run "${GAPS_S:-200}" learner_gaps python3 -m benchmarks.learner_gaps ${GAPS_ARGS:-} ;;
    lgraphs) run "${LGRAPHS_S:-200}" learner_cuda_graphs python3 -m benchmarks.learner_cuda_graphs_gpu_check ;;
    invariant) run "${INV_S:-120}" invariant python3 -m benchmarks.invariant_gpu_check ;;
    backend) run "${BACKEND_S:-200}" backend python3 -m benchmarks.backend_gpu_check ${BACKEND_ARGS:-} ;;
    quantize) run "${QUANT_S:-90}" quantize python3 -m benchmarks.quantize ;;
    gradloc) run "${GRADLOC_S:-150}" grad_localize python3 -m benchmarks.grad_localize_gpu ${GRADLOC_ARGS:-} ;;
    tune) run "${TUNE_S:-330}" tune_kernels python3 -m benchmarks.tune_kernels ${TUNE_ARGS:-} ;;
    tuneattn) run "${TUNEATTN_S:-300}" tune_attention python3 -m benchmarks.tune_attention ${TUNEATTN_ARGS:-} ;;
    numerics) run "${NUMERICS_S:-120}" elementwise_numerics python3 -m benchmarks.elementwise_numerics_gpu ${NUMERICS_ARGS:-} ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
tar czf "$R/../session.tgz" -C "$R" .
rm -rf "$R"
