"""benchmarks.decode_real_shapes' arithmetic (CPU, no kernel runs): the per-layer slope and the
report built from synthetic timings."""

import argparse

import pytest

from benchmarks.decode_real_shapes import HF_LABEL, report, slope


def test_slope_recovers_per_layer_and_outside():
    # 2 layers: 0.5 outside + 2 x 0.1; 8 layers: 0.5 + 8 x 0.1; the real model has 36
    s = slope(0.7, 1.3, layers=2, full=36)
    assert s["per_layer"] == pytest.approx(0.1)
    assert s["outside"] == pytest.approx(0.5)
    assert s["whole"] == pytest.approx(0.5 + 36 * 0.1)


def test_report_ratios_and_errors():
    args = argparse.Namespace(model="qwen3-8b", layers=2, prompt=128, new_tokens=48)
    env = {"gpu": "GPU", "torch": "t", "triton": "tr", "commit": "c"}
    step = {2: 1.0, 8: 1.6}  # strict: per layer 0.1 ms, outside 0.8, whole 4.4 ms
    hf = {2: 1.3, 8: 2.5}  # per layer 0.2, outside 0.9, whole 8.1 ms
    rows = {
        "minite strict NVFP4": {d: {1: {"step_ms": ms}} for d, ms in step.items()},
        HF_LABEL: {d: {1: {"step_ms": ms}} for d, ms in hf.items()},
    }
    rows["minite strict NVFP4"][8][16] = "RuntimeError: boom"
    roof = {
        "context": 152,
        "max_seq_len": 176,
        "roofline_ms": {
            "strict": {"2": {"1": 0.5}, "8": {"1": 0.8}},
            "stock": {"2": {"1": 0.6}, "8": {"1": 1.2}},
        },
    }
    text = report(rows, roof, env=env, args=args, batches=[1, 16])
    strict_row = next(
        line for line in text.splitlines() if line.startswith("| minite strict NVFP4 | 1 ")
    )
    cells = [c.strip() for c in strict_row.split("|")[1:-1]]
    assert cells[2] == "100.0"  # per layer us
    assert cells[3] == "50.0" and cells[4] == "50%"  # roofline per layer 0.05 ms
    assert cells[6] == "4.40"  # whole-model step ms
    assert cells[8] == f"{8.1 / 4.4:.2f}x"  # vs transformers
    assert "6.86 ms" in cells[10]  # the published vLLM figure at batch 1
    assert "ERROR minite strict NVFP4, 8 layers, batch 16: RuntimeError: boom" in text
