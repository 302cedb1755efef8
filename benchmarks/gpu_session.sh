#!/usr/bin/env bash
# Every GPU call of the project, one PART each; a device call (600 s) fits about two parts.
#   MINITE_COMMIT=<sha> PARTS="alignment rollout" bash benchmarks/gpu_session.sh
# Results (md + json, benchmarks.common.write_results) and one log per part, named as the result
# files (<date>_<topic>_<commit>.log), are packed into $OUT/session.tgz.
# Parts (default PARTS="pytest learner alignment rollout"):
#   correctness, tests/gpu and tests/codegen under pytest:
#     pytest (PYTEST_FILES picks the CUDA test files), codegen, kernels, graphs, cbatch
#     (continuous batching under CUDA graphs, the per-row Gumbel noise kernel), lgraphs,
#     alignment (ALIGN_MARK="gpu and not slow" skips batch 256; ALIGN_ARGS), backend
#     (BACKEND_ARGS), fusion, numerics (NUMERICS_ARGS), decode_tests, kc_checks (alignment at
#     batch 1 / 8 / 64 and the backend check with the forward GEMMs in KC-chunked order, KC
#     default 1024: pytest's --k-chunk what-if; issue 42);
#   benchmarks (benchmarks/): gemm, grouped_gemm, quantize, invariant, decode_gemm (DECODE_ARGS,
#     e.g. "--sweep --sweep-only weights_right"), learner (LEARNER_ARGS, default --profile),
#     (DECODE_ARGS="--k-chunk 1024 --splits --learner-forward": split-K under the K-chunked
#     order, a what-if while sm_90 pins one chain; issue 42),
#     learner_forward (the learner forward GEMM tiles in the K-chunked order), k_chunks_tests,
#     learner_rounds (fused vs unfused vs Inductor BF16 in paired rounds, ROUNDS),
#     learner_on_change (quantize_weights=on_change vs every_call vs Inductor BF16 in paired
#     rounds, MICRO_BATCHES passes per optimizer step, default 4; MICRO_BATCHES=1 for the
#     one-pass step), learner_kc (the strict step pinned vs its forward GEMMs in KC-chunked
#     order, KC default 1024, vs Inductor BF16, paired rounds; issue 42), rollout
#     (ROLLOUT_ARGS), rollout_profile;
#   tools (tools/): gaps (GAPS_ARGS), gradloc (GRADLOC_ARGS="--models moe,llama --recipes
#     strict,te,bf16"), tune (TUNE_ARGS="--only wgrad"), tuneattn (TUNEATTN_ARGS), grpo_variants
#     (GRPO_S seconds per variant).
# Each part's time limit is <NAME>_S (e.g. ROLLOUT_S=420).
# Issue 41 (the rollout engine): PARTS="graphs alignment" ALIGN_MARK="gpu and not slow", then
# PARTS=rollout.
# Issue 52 (real shapes): PARTS=real_shapes (learner 8 x 2048 / 4 x 8192 and MoE 8 x 2048 at full
# vocabulary, engine 64 x 2048 prompts + 256 new and 8 x 8192 new, learner == rollout; peak memory
# in the part's json).
# Issue 54 (continuous batching): PARTS=cbatch; PARTS=long_tail (continuous vs static batching
# of 256 long-tailed requests, Qwen3-8B-shaped at 4 layers; LT_MODEL=qwen3-30b-a3b for the MoE).
# Issue 56 (multi-GPU, a multi-GPU kind only, e.g. nvidia-h100-x8): PARTS=multi_gpu (FSDP2 strict
# learner on N-1 GPUs, the packed-only engine on the last, NVFP4 bytes over NCCL vs a BF16 refit,
# learner == rollout after every sync, N vs 1 gradients); --prompts a multiple of N - 1.
# Issue 54 (one GRPO step per phase, strict / bf16 / stock pairing, long-tailed responses):
# PARTS=rl_step (Qwen3-8B-shaped, 4 layers, full vocabulary), then RL_MODEL=qwen3-30b-a3b.
# Issue 53 (decode at real shapes): PARTS=decode_8b (Qwen3-8B-shaped, full vocabulary, 2 and 8
# layers: per layer + whole-model estimate, strict / bf16 / stock / transformers at batch 1, 16),
# PARTS=decode_moe (Qwen3-30B-A3B-shaped, strict vs bf16 at batch 1, 64); rooflines in
# benchmarks/rooflines/ (`--roofline-only`, computed on a CPU). PARTS=decode_fill: the split
# quantize forms == the one-launch forms bitwise at Qwen3-8B widths, the Gumbel kernel == torch;
# then benchmarks.decode_quantize. PARTS=decode_fusions: the decode GEMM's quantizing prologue,
# the bf16 q/k/v and gate/up groups, routing_order, the rotary in the norm pair, the noise in
# sample_argmax, the position mask and the rotary tables (libdevice cos / sin == ATen's at every
# position to 128k) == the ops they replace on CUDA (and engine == learner); run it before trusting
# the decode figures of a commit that has them.
# Waiting runs, one device call each: issue 43, PARTS=learner_on_change MICRO_BATCHES=1 (one pass
# per step with the captured refresh); issue 42, PARTS=kc_checks, PARTS=learner_kc, then
# PARTS=decode_gemm DECODE_ARGS="--k-chunk 1024 --splits --learner-forward".
set -u
export PYTHONUNBUFFERED=1
R="${OUT:-/tmp/out}/r"
mkdir -p "$R"
export OUT="$R"
PARTS="${PARTS:-pytest learner alignment rollout}"
STAMP_DATE="$(date +%F)"; STAMP_COMMIT="${MINITE_COMMIT:-unknown}"; STAMP_COMMIT="${STAMP_COMMIT:0:7}"
run() { local t=$1 name=$2; shift 2; local log="$R/${STAMP_DATE}_${name}_${STAMP_COMMIT}.log"; echo "== $name"; timeout "$t" "$@" > "$log" 2>&1; echo "rc=$? $name"; tail -4 "$log"; }
TWO_RECIPES="minite strict NVFP4;minite bf16 recipe"
# the `pytest` part's CUDA test files, found by name wherever tests/ keeps them
CUDA_TESTS="test_attention_backward test_quantize_global test_abs_max test_rms_norm_backward test_nvfp4_kernels test_nvfp4_ops test_row_scale test_sampling"
cuda_test_files() { for t in $CUDA_TESTS; do find tests -name "$t.py"; done; }
for part in $PARTS; do
  case "$part" in
    # correctness
    pytest) run "${PYTEST_S:-240}" pytest_cuda python3 -m pytest -q ${PYTEST_FILES:-$(cuda_test_files)} ;;
    codegen) run "${CODEGEN_S:-240}" pytest_codegen_cuda python3 -m pytest -q tests/codegen ;;
    kernels) run "${KERNELS_S:-240}" pytest_gpu_kernels python3 -m pytest -m gpu -q tests/gpu/test_gpu_nvfp4.py tests/gpu/test_gpu_invariant_ops.py tests/gpu/test_gpu_bucket_invariance.py ;;
    cbatch) run "${CBATCH_S:-300}" pytest_continuous_batching python3 -m pytest -q tests/gpu/test_gpu_continuous_batching.py tests/codegen/invariant/test_gumbel_noise.py ;;
    graphs) run "${GRAPHS_S:-200}" cuda_graphs python3 -m pytest -m gpu -q tests/gpu/test_gpu_cuda_graphs.py tests/gpu/test_gpu_invariant_ops.py -k "engine or sampling or replay or in_place" ;;
    lgraphs) run "${LGRAPHS_S:-200}" learner_cuda_graphs python3 -m pytest -m gpu -q tests/gpu/test_gpu_cuda_graphs.py -k learner ;;
    alignment) run "${ALIGN_S:-300}" alignment python3 -m pytest -m "${ALIGN_MARK:-gpu}" -q tests/gpu/test_gpu_alignment.py ${ALIGN_ARGS:-} ;;
    backend) run "${BACKEND_S:-200}" backend python3 -m pytest -m gpu -q tests/gpu/test_gpu_backend.py ${BACKEND_ARGS:-} ;;
    fusion) run "${FUSION_S:-240}" pytest_fusion python3 -m pytest -q -m gpu tests/gpu/test_gpu_fusion.py ;;
    numerics) run "${NUMERICS_S:-120}" elementwise_numerics python3 -m pytest -m gpu -q tests/gpu/test_gpu_elementwise_numerics.py ${NUMERICS_ARGS:-} ;;
    real_shapes) MINITE_GPU_REPORT="$R/${STAMP_DATE}_real_shapes_${STAMP_COMMIT}.json" run "${REAL_S:-540}" real_shapes python3 -m pytest -m gpu -q -s tests/gpu/test_gpu_real_shapes.py ${REAL_ARGS:-} ;;
    decode_fill) run "${FILL_TESTS_S:-200}" pytest_decode_fill python3 -m pytest -q tests/gpu/test_gpu_decode_fill.py tests/gpu/test_gpu_decode_ops.py
      run "${FILL_S:-200}" decode_quantize python3 -m benchmarks.decode_quantize ;;
    # the decode fusions of 2026-12-07 (4, 5): the ones never run on CUDA first (the 2f649f3 run passed 42 tests in 230 s)
    decode_fusions) run "${DEC_FUSIONS_S:-560}" pytest_decode_fusions python3 -m pytest -v -m gpu tests/gpu/test_gpu_grouped_parts.py tests/gpu/test_gpu_position_mask.py tests/gpu/test_gpu_attention_parts.py tests/gpu/test_gpu_combine_norm_parts.py tests/gpu/test_gpu_decode_gemm_prologue.py tests/gpu/test_gpu_bf16_decode_fusions.py tests/gpu/test_gpu_routing_order.py tests/gpu/test_gpu_rotary_fusion.py tests/gpu/test_gpu_decode_ops.py tests/gpu/test_gpu_rotary_tables.py tests/gpu/test_gpu_invariant_ops.py tests/codegen/invariant/test_fused_group_linear.py tests/codegen/moe/test_grouped_mm_gathered.py ;;
    decode_tests) run "${DECODE_TESTS_S:-200}" pytest_gpu_decode python3 -m pytest -q -m "gpu and not slow" tests/gpu/test_gpu_decode_gemm.py tests/codegen/nvfp4/test_decode_gemm.py tests/codegen/nvfp4/test_k_chunks.py tests/gpu/test_gpu_alignment.py ;;
    # benchmarks
    gemm) run "${GEMM_S:-240}" gemm python3 -m benchmarks.gemm ;;
    grouped_gemm) run "${GROUPED_S:-240}" grouped_gemm python3 -m benchmarks.grouped_gemm ;;
    quantize) run "${QUANT_S:-90}" quantize python3 -m benchmarks.quantize ;;
    invariant) run "${INV_S:-120}" invariant python3 -m benchmarks.invariant ;;
    decode_gemm) run "${DECODE_S:-540}" decode_gemm python3 -m benchmarks.decode_gemm ${DECODE_ARGS:-} ;;
    learner_forward) run "${LFWD_S:-150}" learner_forward_k_chunks python3 -m benchmarks.decode_gemm_k_chunks ;;
    kc_checks) run "${KCC_S:-540}" alignment_backend_kc"${KC:-1024}" python3 -m pytest -q -m "gpu and not slow" tests/gpu/test_gpu_alignment.py tests/gpu/test_gpu_backend.py --k-chunk "${KC:-1024}" ;;
    k_chunks_tests) run "${KCT_S:-120}" pytest_k_chunks_cuda python3 -m pytest -q tests/codegen/nvfp4/test_k_chunks.py ;;
    learner) run "${LEARNER_S:-330}" learner python3 -m benchmarks.learner ${LEARNER_ARGS:---profile} ;;
    learner_rounds) run "${LEARNER_S:-540}" learner python3 -m benchmarks.learner --only-cuda-graphs --skip-ongrid-ab --rounds "${ROUNDS:-10}" --round-iters 20 ;;
    learner_kc) run "${LEARNER_S:-540}" learner_k_chunk python3 -m benchmarks.learner --only-cuda-graphs --skip-ongrid-ab --skip-fusion-ab --skip-on-change-ab --k-chunk "${KC:-1024}" --rounds "${ROUNDS:-10}" --round-iters "${ROUND_ITERS:-10}" ;;
    learner_on_change) run "${LEARNER_S:-540}" learner_on_change python3 -m benchmarks.learner --only-cuda-graphs --skip-ongrid-ab --skip-fusion-ab --micro-batches "${MICRO_BATCHES:-4}" --rounds "${ROUNDS:-10}" --round-iters "${ROUND_ITERS:-10}" ;;
    rollout) run "${ROLLOUT_S:-420}" rollout python3 -m benchmarks.rollout --roofline benchmarks/results/2026-12-06_rollout_roofline_4193161.json ${ROLLOUT_ARGS:-} ;;
    long_tail) run "${LT_S:-560}" rollout_long_tail python3 -m benchmarks.rollout_long_tail --device cuda --model "${LT_MODEL:-qwen3-8b}" --layers "${LT_LAYERS:-4}" --requests "${LT_REQUESTS:-256}" --max-batch "${LT_MAX_BATCH:-64}" --budget "${LT_BUDGET:-1024}" --configs "${LT_CONFIGS:-strict,bf16,stock}" ;;
    decode_8b) run "${DEC8_S:-560}" decode_qwen3_8b python3 -m benchmarks.decode_real_shapes --model qwen3-8b --batches "${DEC_BATCHES:-1,16}" --hf-batches "${HF_BATCHES:-1}" --configs "${DEC_CONFIGS:-all}" --roofline benchmarks/rooflines/qwen3_8b_L2.json ${DEC_ARGS:-} ;;
    decode_moe) run "${DECMOE_S:-560}" decode_qwen3_30b_a3b python3 -m benchmarks.decode_real_shapes --model qwen3-30b-a3b --batches "${DEC_BATCHES:-1,64}" --configs "${DEC_CONFIGS:-$TWO_RECIPES}" --roofline benchmarks/rooflines/qwen3_30b_a3b_L2.json ${DEC_ARGS:-} ;;
    rl_step) run "${RLSTEP_S:-560}" rl_step python3 -m benchmarks.rl_step --model "${RL_MODEL:-qwen3-8b}" --layers "${RL_LAYERS:-4}" --prompts "${RL_PROMPTS:-16}" --group 8 --prompt 256 --budget "${RL_BUDGET:-1024}" --max-batch 64 --steps 2 ${RL_ARGS:-} ;;
    multi_gpu) run "${MGPU_S:-560}" multi_gpu python3 -m benchmarks.multi_gpu --nproc "${MGPU_N:-8}" --model "${MGPU_MODEL:-qwen3-30b-a3b}" --layers "${MGPU_LAYERS:-4}" --prompts "${MGPU_PROMPTS:-7}" --group 8 --prompt 128 --budget "${MGPU_BUDGET:-256}" --max-batch 64 --steps 2 --compare-single ${MGPU_ARGS:-} ;;
    rollout_profile) run "${PROFILE_S:-300}" rollout_profile python3 -m benchmarks.rollout --configs "$TWO_RECIPES" --batches 1,64 --profile-batch 1,64 --skip-hf --name rollout_profile ;;
    # tools
    gaps) run "${GAPS_S:-200}" learner_gaps python3 -m tools.learner_gaps ${GAPS_ARGS:-} ;;
    gradloc) run "${GRADLOC_S:-150}" grad_localize python3 -m tools.grad_localize_gpu ${GRADLOC_ARGS:-} ;;
    tune) run "${TUNE_S:-330}" tune_kernels python3 -m tools.tune_kernels ${TUNE_ARGS:-} ;;
    tuneattn) run "${TUNEATTN_S:-300}" tune_attention python3 -m tools.tune_attention ${TUNEATTN_ARGS:-} ;;
    grpo_variants) run "$(( ${GRPO_S:-150} * 2 + 60 ))" grpo_step python3 -m tools.grpo_variants --variants strict,bf16 --budget-s "${GRPO_S:-150}" ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
tar czf "$R/../session.tgz" -C "$R" .
rm -rf "$R"
