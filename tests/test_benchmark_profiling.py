"""Benchmark profiling helpers: the gap analysis of `tools.learner_gaps` (a pure function of
chrome-trace events) and the kernel filter of `benchmarks.common.profile_call`."""

from tools.learner_gaps import attribute_kernels, gap_summary


def test_gap_summary_buckets_overlaps_and_cpu_ops():
    k = lambda name, ts, dur: {"cat": "kernel", "name": name, "ts": ts, "dur": dur}  # noqa: E731
    events = [
        k("a", 0.0, 10.0),
        k("b", 5.0, 10.0),  # overlaps a: no gap, extends the busy end to 15
        k("c", 16.0, 4.0),  # 1 us gap
        k("d", 50.0, 10.0),  # 30 us gap
        k("e", 63.0, 1.0),  # 3 us gap
        {"cat": "cpu_op", "name": "host_thing", "ts": 25.0, "dur": 5.0},
        {"cat": "cpu_op", "name": "elsewhere", "ts": 100.0, "dur": 5.0},
        {"cat": "python_function", "name": "ignored", "ts": 0.0},
    ]
    s = gap_summary(events, top=2)
    assert s["kernels"] == 5 and s["busy_ms"] == 35.0 / 1e3  # kernel time summed
    assert s["span_ms"] == 64.0 / 1e3
    assert s["gaps"] == 3 and abs(s["gap_ms"] - 34.0 / 1e3) < 1e-12
    counts = [b["count"] for b in s["buckets"]]
    assert counts == [1, 1, 0, 1, 0]  # <2, 2-5, 5-20, 20-100, >=100 us
    top = s["largest"][0]
    assert top["gap_us"] == 30.0 and top["after_kernel"] == "c" and top["before_kernel"] == "d"
    assert top["cpu_ops_meanwhile"] == ["host_thing"]
    assert len(s["largest"]) == 2
    assert gap_summary([]) == {"kernels": 0}


def test_profile_kernel_filter_keeps_aten_lambda_kernels():
    """GPU busy counts ATen kernels whose names hold '#' (template lambdas); it drops only the
    annotations the profiler mirrors on the GPU timeline."""
    from benchmarks.common import is_annotation

    assert is_annotation("Optimizer.step#AdamW.step")
    assert is_annotation("## Call CompiledFxGraph abc ##")
    assert is_annotation("ProfilerStep#2")
    assert is_annotation("my_region#1")
    kernel = ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda("
              "at::TensorIteratorBase&)::{lambda()#3}::operator()() const>")  # fmt: skip
    assert not is_annotation(kernel)
    assert not is_annotation("_quantize_kernel")


def test_attribute_kernels_to_the_outermost_fp4_compile_op():
    """Each kernel's time goes to the widest fp4_compile:: op on its launching thread around its
    launch (linked by correlation id), "(none)" outside; stock (C++-named) kernels counted apart."""

    def op(name, ts, dur, tid=1):
        return {"cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid}

    def launch(corr, ts, tid=1):
        return {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 1.0,
                "tid": tid, "args": {"correlation": corr}}  # fmt: skip

    def kernel(corr, name, dur):
        return {"cat": "kernel", "name": name, "ts": 100.0 + corr, "dur": dur,
                "args": {"correlation": corr}}  # fmt: skip

    stock = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>()"
    events = [
        op("fp4_compile::nvfp4_grouped_mm_backward", 0.0, 50.0),
        op("fp4_compile::quantize", 10.0, 5.0),  # nested: the outer op owns its kernels
        op("aten::fill_", 20.0, 2.0),
        launch(1, 11.0), kernel(1, "_quantize_kernel", 30.0),
        launch(2, 21.0), kernel(2, stock, 2.0),
        launch(3, 60.0), kernel(3, "triton_poi_fused_add_0", 4.0),  # outside any op
        launch(4, 12.0, tid=2), kernel(4, "_row_abs_max_kernel", 8.0),  # another thread
        kernel(5, "no_launch_seen", 1.0),
        {**launch(6, 13.0), "cat": "cuda_driver", "name": "cuLaunchKernelEx"},  # Triton's path
        kernel(6, "_ongrid_kernel", 5.0),
    ]  # fmt: skip
    att = attribute_kernels(events)
    by_op = {r["op"]: r for r in att["by_op"]}
    mm = by_op["fp4_compile::nvfp4_grouped_mm_backward"]
    assert mm["kernels"] == 3 and abs(mm["gpu_ms"] - 0.037) < 1e-12
    assert mm["stock_kernels"] == 1 and abs(mm["stock_ms"] - 0.002) < 1e-12
    assert by_op["(none)"]["kernels"] == 3 and by_op["(none)"]["stock_kernels"] == 0
    assert "fp4_compile::quantize" not in by_op
    assert att["by_op"][0]["op"] == "fp4_compile::nvfp4_grouped_mm_backward"


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
