"""The sm_90 code of the learner's GEMM kernels, compiled here without a GPU
(`tools.ptx_audit`): every operand load of the main loops is a pipelined 16-byte
asynchronous copy, not a scalar 2-byte load. The MoE wgrad kernel compiled to 96-101 scalar
loads and no software pipeline until its segment width was declared a multiple of 16
(2026-12-04); this keeps that from coming back unnoticed (speed itself is measured on the GPU,
`tools.tune_kernels`)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def audit():
    """The audit's counts, from its own process: this one may hold interpreted kernels."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-m", "tools.ptx_audit", "--json"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_gemm_operands_are_pipelined_async_copies(audit):
    gemms = [name for name in audit if name.startswith(("MoE", "dense wgrad"))]
    assert len(gemms) == 4, sorted(audit)  # MoE wgrad, forward, dgrad; the dense wgrad
    for name in gemms:
        row = audit[name]
        assert row["cp.async 16B"] >= 16, (name, row)  # A and B tiles, every pipeline stage
        # the epilogue's scales, not operands (the gathered forward also loads its rows' index,
        # once, before the K loop)
        assert row["ld.global scalar"] <= (12 if "gathered" in name else 8), (name, row)
        assert row["wgmma"] >= 1, (name, row)


def test_attention_kernels_keep_their_async_copies(audit):
    att = [name for name in audit if name.startswith("attention")]
    assert len(att) == 6, sorted(audit)  # forward, dQ, dK/dV; causal and with a mask tensor
    for name in att:
        assert audit[name]["cp.async 16B"] >= 16, (name, audit[name])


def test_attention_forward_and_dq_do_not_spill(audit):
    """The forward held FP32 copies of q, k, v (255 registers, spill stores) until 2026-12-04
    and, with a mask tensor, a [rows, keys] tensor of byte pointers; both gone. (dK/dV at its
    pinned 4 warps does spill and still measured faster than 8 warps without:
    benchmarks/results/2026-12-04_tune_attention_mask_c9bc48f.md, the 10bb871 run.)"""
    names = [n for n in audit if n.startswith(("attention forward", "attention backward dQ"))]
    assert len(names) == 4, sorted(audit)
    for name in names:
        assert audit[name]["spill stores"] == 0, (name, audit[name])


def test_quantize_kernels_load_and_store_vectors(audit):
    """The quantize kernel (ALU-bound: its instruction count is its time) reads x and writes
    its on-grid values as vectors in every learner launch kind."""
    quant = [name for name in audit if name.startswith("quantize")]
    assert len(quant) == 4, sorted(audit)
    for name in quant:
        assert audit[name]["ld.global vector"] >= 4, (name, audit[name])
        assert audit[name]["st.global vector"] >= 4, (name, audit[name])
