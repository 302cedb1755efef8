"""The learner's profile gap analysis (`tools.learner_gaps`): pure functions of chrome-trace
events, checked on hand-made traces (exact)."""

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


def test_attribute_kernels_to_the_outermost_fp4_compile_op():
    """Each kernel's time goes to the widest fp4_compile:: op on its launching thread around its
    launch (linked by correlation id), "(none)" outside; stock (C++-named) kernels counted apart."""

    def op(name, ts, dur, tid=1):
        return {"cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid}

    def launch(corr, ts, tid=1):
        return {
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "ts": ts,
            "dur": 1.0,
            "tid": tid,
            "args": {"correlation": corr},
        }

    def kernel(corr, name, dur):
        return {
            "cat": "kernel",
            "name": name,
            "ts": 100.0 + corr,
            "dur": dur,
            "args": {"correlation": corr},
        }

    stock = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>()"
    events = [
        op("fp4_compile::nvfp4_grouped_mm_backward", 0.0, 50.0),
        op("fp4_compile::quantize", 10.0, 5.0),  # nested: the outer op owns its kernels
        op("aten::fill_", 20.0, 2.0),
        launch(1, 11.0),
        kernel(1, "_quantize_kernel", 30.0),
        launch(2, 21.0),
        kernel(2, stock, 2.0),
        launch(3, 60.0),
        kernel(3, "triton_poi_fused_add_0", 4.0),  # outside any op
        launch(4, 12.0, tid=2),
        kernel(4, "_row_abs_max_kernel", 8.0),  # another thread
        kernel(5, "no_launch_seen", 1.0),
        {**launch(6, 13.0), "cat": "cuda_driver", "name": "cuLaunchKernelEx"},  # Triton's path
        kernel(6, "_ongrid_kernel", 5.0),
    ]
    att = attribute_kernels(events)
    by_op = {r["op"]: r for r in att["by_op"]}
    mm = by_op["fp4_compile::nvfp4_grouped_mm_backward"]
    assert mm["kernels"] == 3 and abs(mm["gpu_ms"] - 0.037) < 1e-12
    assert mm["stock_kernels"] == 1 and abs(mm["stock_ms"] - 0.002) < 1e-12
    assert by_op["(none)"]["kernels"] == 3 and by_op["(none)"]["stock_kernels"] == 0
    assert "fp4_compile::quantize" not in by_op
    assert att["by_op"][0]["op"] == "fp4_compile::nvfp4_grouped_mm_backward"
