#!/usr/bin/env bash
# The kernel-level GPU session: correctness first, then speed. Results (md + json) and logs are
# packed into $OUT/kernels.tgz (the device returns few files per call).
#   MINITE_COMMIT=<sha> bash benchmarks/h200_kernels_session.sh
set -u
R="${OUT:-/tmp/out}/r"
mkdir -p "$R"
export OUT="$R"
# logs are named as the result files: <date>_<topic>_<commit>.log
STAMP_DATE="$(date +%F)"; STAMP_COMMIT="${MINITE_COMMIT:-unknown}"; STAMP_COMMIT="${STAMP_COMMIT:0:7}"
run() { local name=$1; shift; local log="$R/${STAMP_DATE}_${name}_${STAMP_COMMIT}.log"; echo "== $name"; timeout 240 "$@" > "$log" 2>&1; echo "rc=$? $name"; tail -3 "$log"; }
run pytest_codegen_cuda python3 -m pytest -q tests/codegen
run pytest_gpu_kernels python3 -m pytest -m gpu -q tests/gpu/test_gpu_nvfp4.py tests/gpu/test_gpu_invariant_ops.py tests/gpu/test_gpu_bucket_invariance.py
run invariant python3 -m benchmarks.invariant
run gemm python3 -m benchmarks.gemm
run grouped_gemm python3 -m benchmarks.grouped_gemm
run learner python3 -m benchmarks.learner --profile
tar czf "$R/../kernels.tgz" -C "$R" .
rm -rf "$R"
