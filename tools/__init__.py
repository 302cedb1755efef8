"""Investigation tools, run from the repository root as `python -m tools.<name>` (GPU unless a
tool says otherwise): localize a learner/rollout or compiled/eager gap (`localize_gpu`,
`grad_localize_gpu` with `op_recorder`, `elementwise_numerics_gpu`), see where the learner's
time goes (`learner_gaps`), tune pinned kernel configs offline (`tune_kernels`, `tune_attention`),
read the sm_90 code of the hot kernels on any machine (`ptx_audit`, `decode_sass_audit`), compare
and localize against vLLM (`vllm_gap`, `vllm_localize`, `vllm_weight_sync`) and run a GRPO preset
in its recipe variants (`grpo_variants`). The benchmarks a user or reviewer runs are in
benchmarks/; results of both go to benchmarks/results/."""
