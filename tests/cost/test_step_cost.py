"""The step cost model (`fp4_compile/cost/rollout.py`; its command, `benchmarks/step_cost.py`):
structural facts of the rollout step's lowered graphs, computed from shapes on the CPU (no
kernel runs). Exact tier: byte and FLOP counts are integers derived by hand from the shapes."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
import torch

from benchmarks.step_cost import main
from fp4_compile.cost import build_model, expert_fraction, step_cost
from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe

BATCH, CONTEXT = 2, 16


@pytest.fixture(scope="module")
def configs(tmp_path_factory):
    """config.json folders of the tiny Qwen3 (4 q / 2 kv heads of 32, hidden 64, vocab 128)
    and the tiny Qwen3-MoE (4 experts, top-2)."""
    out = {}
    for name, model in (("dense", tiny_qwen3()), ("moe", tiny_qwen3_moe())):
        folder = tmp_path_factory.mktemp(name)
        model.config.save_pretrained(folder)
        out[name] = str(folder)
    return out


@pytest.fixture(scope="module")
def costs(configs):
    """step_cost of both tiny models at batch 2, context 16, for strict and bf16."""
    out = {}
    for name, path in configs.items():
        model, note = build_model(path)
        for recipe in ("strict", "bf16"):
            out[name, recipe] = step_cost(model, note, batch=BATCH, context=CONTEXT, recipe=recipe)
    return out


def test_json_has_the_step_keys(configs):
    """--json prints one object with the decode step's totals, its per-op rows and the
    prefill summary."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(
            [
                "--model",
                configs["moe"],
                "--batch",
                "2",
                "--context",
                "16",
                "--recipe",
                "stock",
                "--json",
            ]
        )
    res = json.loads(buf.getvalue())
    for key in ("launches", "bytes", "flops", "roofline_ms", "per_op", "prefill", "assumptions"):
        assert key in res, key
    assert res["launches"] == sum(r["launches"] for r in res["per_op"]) > 0
    assert res["bytes"] == sum(r["bytes"] for r in res["per_op"]) > 0
    assert res["prefill"]["flops"] > res["flops"] > 0


def test_known_linears_match_hand_counts(costs):
    """o_proj of the tiny Qwen3 in strict (x [2, 128] BF16, W [64, 128] NVFP4) and its BF16
    lm_head (W [128, 64]): bytes and FLOPs by hand."""
    rows = costs["dense", "strict"]["per_op"]
    m, k, n = BATCH, 128, 64
    o_proj = [r for r in rows if r["op"] == "fp4_compile.nvfp4_linear"]
    assert len(o_proj) == 2  # one per layer
    # packed codes K/2 bytes per row + E4M3 scales K/16 per row + FP32 global scale + x BF16
    assert o_proj[0]["bytes_read"] == n * k // 2 + n * k // 16 + 4 + m * k * 2
    assert o_proj[0]["bytes_written"] == m * n * 2
    assert o_proj[0]["flops"] == 2 * m * n * k
    assert o_proj[0]["launches"] == 2  # the activation quantize, then the GEMM
    head = [r for r in rows if r["op"] == "fp4_compile.invariant_linear"][-1]
    vocab, hidden = 128, 64
    assert head["bytes_read"] == vocab * hidden * 2 + m * hidden * 2
    assert head["bytes_written"] == m * vocab * 2
    assert head["flops"] == 2 * m * vocab * hidden


def test_strict_reads_fewer_bytes_than_bf16_where_weights_dominate(costs):
    """At batch 2 and a 16-token cache the GEMM weights are most of the decode step's bytes;
    strict (NVFP4 weights, 4.5 bits) must then move fewer bytes than the bf16 recipe."""
    for name in ("dense", "moe"):
        strict, bf16 = costs[name, "strict"], costs[name, "bf16"]
        gemm = sum(r["bytes"] for r in bf16["per_op"] if "linear" in r["op"] or "mm" in r["op"])
        assert gemm > bf16["bytes"] / 2, name
        assert strict["bytes"] < bf16["bytes"], name


def test_moe_counts_the_experts_a_step_touches(configs, costs):
    """Grouped GEMMs read E*(1-(1-k/E)^T) of E experts' weights: 4 experts, top-2, T = 2 tokens
    -> 3 experts, 3/4 of the weights."""
    model, _ = build_model(configs["moe"])
    frac, words = expert_fraction(model, BATCH)
    assert frac == pytest.approx(1 - (1 - 2 / 4) ** 2)
    assert "uniform" in words
    rows = costs["moe", "bf16"]["per_op"]
    grouped = [r for r in rows if r["op"] == "fp4_compile.invariant_grouped_mm"]
    gate_up = grouped[0]  # w [4, 64, 64] BF16, x [4 rows, 64] BF16, offsets int32 [4]
    assert gate_up["bytes_read"] == int(4 * 64 * 64 * 2 * frac) + 4 * 64 * 2 + 4 * 4
    # strict: the packed codes (and scales) come from the weight cache, counted the same way
    packed = [r for r in costs["moe", "strict"]["per_op"] if "grouped_mm" in r["op"]][0]
    assert packed["bytes_read"] < 4 * 64 * 64 // 2  # below all 4 experts' packed codes


def test_cache_writes_write_the_new_tokens_only(costs):
    """The decode step writes one token's K and V per sequence into the static cache: one
    `kv_cache_write` per layer writing both, and nothing more."""
    for res in costs.values():
        writes = [r for r in res["per_op"] if r["kv_cache"].startswith("writes")]
        assert len(writes) == 2  # k and v in one op, 2 layers
        assert all(r["bytes_written"] == 2 * BATCH * 2 * 1 * 32 * 2 for r in writes)


def test_bad_arguments_are_refused(configs):
    with pytest.raises(ValueError, match="--model"):
        build_model("no-such-model")
    model, note = build_model(configs["dense"])
    with pytest.raises(ValueError, match="recipe"):
        step_cost(model, note, batch=1, context=8, recipe="fp8")
    with pytest.raises(ValueError, match="max_seq_len"):
        step_cost(model, note, batch=1, context=8, recipe="strict", max_seq_len=4)


def test_builtin_models_are_meta(configs):
    """The built-in shapes cost seconds, not GBs: their weights live on the meta device."""
    model, note = build_model("qwen3-8b", layers=1)
    assert next(model.parameters()).device == torch.device("meta")
    assert "1 of its 36 layers" in note


def test_no_op_in_the_decode_step_copies_the_kv_cache(costs):
    """Attention reads the cache as it is (issue 41, part 2): no op of the decode step reads a
    KV cache and writes a copy of it (`fp4_compile::repeat_kv` did: K and V once per query head
    over the whole static cache, in every layer, every step)."""
    for (name, recipe), res in costs.items():
        copies = [(r["op"], r["bytes_written"]) for r in res["per_op"] if r["copies_kv_cache"]]
        assert copies == [], f"{name} {recipe}: ops copying the KV cache: {copies}"
        assert res["kv_cache_copy_bytes"] == 0
