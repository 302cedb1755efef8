"""The learner step in the step cost model (`fp4_compile/cost/learner.py`): the backward's
NVFP4 GEMM ops counted as the kernels their CUDA dispatch launches, weight quantizes apart,
AdamW from the parameters; the on_change learner's graphs bound to a weight store, its rewrite
priced once per optimizer step. Facts checked against hand counts on a tiny Qwen3."""

from __future__ import annotations

import pytest
import torch

from fp4_compile.cost import adamw_rows, at_micro_batches, learner_step_cost
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe

BATCH, SEQ = 2, 32


@pytest.fixture(scope="module")
def dense():
    model = tiny_qwen3(layers=1, dtype=torch.bfloat16).to("meta")
    return model, {
        r: learner_step_cost(model, "tiny", recipe=r, batch=BATCH, seq=SEQ)
        for r in ("strict", "stock")
    }


def _flops(res, pred) -> int:
    return sum(a["flops"] for a in res["by_op"] if pred(a["op"]))


def test_each_nvfp4_gemm_has_its_dgrad_and_wgrad_gemm(dense):
    model, costs = dense
    res = costs["strict"]
    fwd = _flops(res, lambda op: op.startswith("fp4_compile.nvfp4_linear") and ":" not in op)
    # hand count: q, k, v, o, gate, up, down of the one layer, 2*M*N*K each, M = BATCH*SEQ
    layer = model.model.layers[0]
    linears = [*vars(layer.self_attn)["_modules"].values(), *vars(layer.mlp)["_modules"].values()]
    want = sum(
        2 * BATCH * SEQ * m.in_features * m.out_features
        for m in linears
        if isinstance(m, torch.nn.Linear)
    )
    assert fwd == want
    assert _flops(res, lambda op: op.endswith(": dgrad GEMM")) == want
    assert _flops(res, lambda op: op.endswith(": wgrad GEMM")) == want
    ops = {a["op"] for a in res["by_op"]}
    assert not any(op.endswith("_backward") for op in ops if "nvfp4" in op), (
        "an NVFP4 backward op was counted as one kernel"
    )


def test_weight_quantize_is_apart_and_only_in_nvfp4(dense):
    _, costs = dense
    strict, stock = costs["strict"], costs["stock"]
    assert strict["weight_quantize"]["launches"] >= 7 and strict["weight_quantize"]["bytes"] > 0
    assert stock["weight_quantize"]["launches"] == 0
    parts = ("forward", "weight_quantize", "backward", "optimizer")
    for res in (strict, stock):
        assert res["step"]["bytes"] == sum(res[p]["bytes"] for p in parts)
        assert res["step"]["launches"] == sum(res[p]["launches"] for p in parts)


def test_adamw_reads_and_writes_by_hand():
    model = tiny_qwen3(layers=1, dtype=torch.bfloat16).to("meta")
    n = sum(p.numel() for p in model.parameters())
    (row,) = adamw_rows(model)
    assert row.bytes_read == n * (2 + 2 + 4 + 4)  # parameter, gradient, two FP32 moments
    assert row.bytes_written == n * (2 + 4 + 4)


def test_moe_backward_counts_the_grouped_kernels():
    model = tiny_qwen3_moe(layers=1, dtype=torch.bfloat16).to("meta")
    res = learner_step_cost(model, "tiny moe", recipe="strict", batch=BATCH, seq=SEQ)
    ops = {a["op"] for a in res["by_op"]}
    for part in ("dgrad grouped GEMM", "wgrad grouped GEMM", "dY^T segments quantize"):
        assert f"fp4_compile.nvfp4_grouped_mm_backward: {part}" in ops


@pytest.mark.parametrize("build", [tiny_qwen3, tiny_qwen3_moe], ids=["qwen3", "qwen3_moe"])
def test_on_change_moves_the_weight_quantize_out_of_the_forward(build):
    """At >= ONGRID_FORWARD_MIN_ROWS rows per weight (the learner's shapes on CUDA): on_change's
    store writes what every_call's forward quantizes (the same bytes, plus a copy of each
    global decode) once per optimizer step; the forward and backward are unchanged; the store's
    earlier form decoded each on-grid copy in every forward."""
    model = build(layers=1, dtype=torch.bfloat16).to("meta")
    batch, seq = 8, 128  # 1024 tokens: >= 256 rows per expert of the tiny MoE's 4
    res = {
        m: learner_step_cost(
            model, "tiny", recipe="strict", batch=batch, seq=seq, quantize_weights=m
        )
        for m in ("every_call", "on_change", "on_change, decode per call")
    }
    every, now, before = res["every_call"], res["on_change"], res["on_change, decode per call"]
    weights = every["weight_quantize"]
    assert weights["bytes"] > 0 and every["ongrid_decode_per_call"]["bytes"] == 0
    gd_copies = [a for a in now["by_op"] if a["op"] == "refresh: global decode copy"]
    assert now["weight_quantize"]["bytes"] == weights["bytes"] + gd_copies[0]["bytes"]
    assert now["weight_quantize"]["launches"] == weights["launches"] + gd_copies[0]["launches"]
    for part in ("forward", "backward"):
        assert now[part] == every[part], part
    decode = before["ongrid_decode_per_call"]
    assert decode["launches"] == gd_copies[0]["count"] and decode["bytes"] > 0
    assert before["forward"]["bytes"] == every["forward"]["bytes"] + decode["bytes"]
    four = {m: at_micro_batches(r, 4) for m, r in res.items()}
    saved = 3 * weights["bytes"] - gd_copies[0]["bytes"]
    assert four["every_call"]["bytes"] - four["on_change"]["bytes"] == saved


def test_expert_weights_quantize_in_two_steps_and_the_what_if_drops_one_read():
    """The experts' weights [E, N, K] (one global scale per expert) are read twice per quantize
    on sm_90, the row maxima then the codes: every_call's quantize op counts 2 launches and reads
    W twice, the store's refresh a row-maxima row beside its quantize; the what-if form (row
    maxima from the optimizer, not built) drops exactly that row."""
    model = tiny_qwen3_moe(layers=1, dtype=torch.bfloat16).to("meta")
    experts = {n: p for n, p in model.named_parameters() if p.dim() == 3}
    assert experts
    what_if = "on_change, row maxima from the optimizer (not built)"
    res = {
        m: learner_step_cost(model, "tiny", recipe="strict", batch=8, seq=128, quantize_weights=m)
        for m in ("every_call", "on_change", what_if)
    }
    w_bytes = sum(p.numel() * p.element_size() for p in experts.values())
    row_max_bytes = w_bytes + sum(p.numel() // p.shape[-1] * 4 for p in experts.values())
    maxima = [
        a for a in res["on_change"]["by_op"] if a["op"] == "refresh: expert weight row maxima"
    ]
    assert len(maxima) == 1 and maxima[0]["count"] == len(experts), maxima
    assert maxima[0]["bytes"] == row_max_bytes
    assert (
        res["on_change"]["weight_quantize"]["bytes"] - res[what_if]["weight_quantize"]["bytes"]
        == row_max_bytes
    )
    assert not any(a["op"] == maxima[0]["op"] for a in res[what_if]["by_op"])
    # every_call: the same two reads (and launches) inside its quantize ops, so its weight work
    # is on_change's less the global decode copies (the test above)
    gd = next(a for a in res["on_change"]["by_op"] if a["op"] == "refresh: global decode copy")
    assert res["every_call"]["weight_quantize"]["bytes"] == (
        res["on_change"]["weight_quantize"]["bytes"] - gd["bytes"]
    )
    assert res["every_call"]["weight_quantize"]["launches"] == (
        res["on_change"]["weight_quantize"]["launches"] - gd["launches"]
    )
