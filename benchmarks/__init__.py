"""The benchmarks a user or reviewer runs, each a document: `python -m benchmarks.<name>` from the
repository root, shapes from a model, the baseline measured in the same run, the ratio printed,
GPU / torch / Triton / commit recorded, results written to benchmarks/results/
(`common.write_results`). On the GPU: `gemm`, `grouped_gemm`, `decode_gemm`, `quantize`,
`invariant` (kernels vs cuBLAS / SDPA / ATen; `common`: launch vs CUDA-graph time),
`learner` (a training step vs Inductor BF16), `rollout` (decode tokens/s), `grpo_evidence` (GRPO
in strict / bf16 / te); on the CPU: `step_cost` and `step_cost_learner` (commands over the
cost models of `fp4_compile.cost`) and `alignment_ablation` (what bitwise alignment buys).
`gpu_session.sh` runs them, and the GPU tests, a few PARTS per device call. Investigation tools
are in tools/."""
