#!/usr/bin/env bash
# The kernel-level GPU session: correctness first, then speed. Results (md + json) and logs are
# packed into $OUT/kernels.tgz (the device returns few files per call).
#   MINITE_COMMIT=<sha> bash benchmarks/h200_kernels_session.sh
set -u
R="${OUT:-/tmp/out}/r"
mkdir -p "$R"
export OUT="$R"
run() { local name=$1; shift; echo "== $name"; timeout 240 "$@" > "$R/$name.log" 2>&1; echo "rc=$? $name"; tail -3 "$R/$name.log"; }
run pytest_codegen_cuda python3 -m pytest -q tests/codegen
run bucket_invariance python3 -m benchmarks.bucket_invariance_gpu
run nvfp4_gpu_check python3 -m benchmarks.nvfp4_gpu_check --out "$R"
run invariant_gpu_check python3 -m benchmarks.invariant_gpu_check --out "$R"
run gemm python3 -m benchmarks.gemm
run grouped_gemm python3 -m benchmarks.grouped_gemm
run learner python3 -m benchmarks.learner --profile
tar czf "$R/../kernels.tgz" -C "$R" .
rm -rf "$R"
