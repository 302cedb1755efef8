"""Benchmark profiling helpers: the kernel filter of `benchmarks.common.profile_call`, the
per-grid table of `benchmarks.common.kernels_by_grid` and the paired rounds of
`benchmarks.learner` (the gap analysis of `tools.learner_gaps`:
tests/tools/test_learner_gaps.py)."""


def test_profile_kernel_filter_keeps_aten_lambda_kernels():
    """GPU busy counts ATen kernels whose names hold '#' (template lambdas); it drops only the
    annotations the profiler mirrors on the GPU timeline."""
    from benchmarks.common import is_annotation

    assert is_annotation("Optimizer.step#AdamW.step")
    assert is_annotation("## Call CompiledFxGraph abc ##")
    assert is_annotation("ProfilerStep#2")
    assert is_annotation("my_region#1")
    kernel = (
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda("
        "at::TensorIteratorBase&)::{lambda()#3}::operator()() const>"
    )
    assert not is_annotation(kernel)
    assert not is_annotation("_quantize_kernel")


def test_kernels_by_grid_sums_each_shape_of_a_kernel():
    """The profile's per-grid table: launches of minite's Triton kernels (names from "_") summed
    by (name, grid), largest first; stock kernels left out."""
    from benchmarks.common import kernels_by_grid

    launches = [
        {"name": "_gemm", "grid": [64, 1, 1], "us": 27.0, "ts": 0},
        {"name": "_gemm", "grid": [256, 1, 1], "us": 100.0, "ts": 1},
        {"name": "_gemm", "grid": [64, 1, 1], "us": 26.0, "ts": 2},
        {"name": "void at::native::copy", "grid": [8, 1, 1], "us": 500.0, "ts": 3},
    ]
    rows = kernels_by_grid(launches)
    assert rows == [
        {"name": "_gemm", "grid": [256, 1, 1], "us": 100.0, "calls": 1},
        {"name": "_gemm", "grid": [64, 1, 1], "us": 53.0, "calls": 2},
    ]


def test_paired_rounds_interleave_the_configs_and_pair_the_ratios(monkeypatch):
    """`learner --rounds`: each round times every config once, in order (A B A B ...); step_ms
    becomes the median of the rounds, and an NVFP4 row's ratio is taken against the BF16 row of
    its own mode in the same round."""
    from benchmarks import learner

    calls, times = [], iter([10.0, 12.0, 11.0, 12.5, 10.0, 11.0])
    monkeypatch.setattr(
        learner, "cuda_time_ms", lambda step, **kw: (calls.append(step), next(times))[1]
    )
    rows = [
        {"label": "torch.compile inductor BF16, CUDA graphs", "step_ms": 9.0, "mode": "g"},
        {"label": "minite strict NVFP4, CUDA graphs", "step_ms": 13.0, "mode": "g"},
    ]
    learner.paired_rounds(rows, {0: "bf16", 1: "nvfp4"}, 4096, rounds=3, iters=2)
    assert calls == ["bf16", "nvfp4"] * 3
    assert rows[0]["rounds_ms"] == [10.0, 11.0, 10.0] and rows[0]["step_ms"] == 10.0
    assert rows[1]["rounds_ms"] == [12.0, 12.5, 11.0] and rows[1]["step_ms"] == 12.0
    assert rows[1]["single_ms"] == 13.0 and rows[1]["tokens_per_s"] == 4096 / 0.012
    assert rows[1]["paired_ratios"] == [10.0 / 12.0, 11.0 / 12.5, 10.0 / 11.0]
    assert "paired_ratios" not in rows[0]
