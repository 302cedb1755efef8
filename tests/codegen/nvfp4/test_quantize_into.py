"""Quantizing into a caller's buffers (a weight store's: `codegen.quantize_into`, the kernels'
`into=`), bitwise what the ops return for the same arguments, with the buffers' addresses kept.
The kernels' `into=` runs under the Triton interpreter on CPU (and on CUDA); `quantize_into`
runs the ops' own implementation (the CPU reference here)."""

import os

import pytest
import torch

from fp4_compile.codegen import quantize_into
from fp4_compile.testing import assert_bitwise_equal

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_kernels = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)


def _weight(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(*shape, generator=g) * torch.logspace(-3, 1, shape[-1])
    return w.to(torch.bfloat16).to(DEV)


def _buffers(w, *, packed: bool, ongrid: bool):
    lead, k = w.shape[:-1], w.shape[-1]
    return dict(
        codes=torch.full((*lead, k // 2 if packed else 0), 7, dtype=torch.uint8, device=w.device),
        scales=torch.zeros(
            (*lead, k // 16 if packed else 0), dtype=torch.float8_e4m3fn, device=w.device
        ),
        ongrid=torch.full(w.shape, 3.0, dtype=torch.bfloat16, device=w.device) if ongrid else None,
    )


@needs_kernels
@pytest.mark.parametrize("global_scale", ["per_tensor", "per_expert"])
@pytest.mark.parametrize("out", ["packed", "ongrid", "both"])
@pytest.mark.parametrize("one_read", [True, False], ids=["one_read", "two_step"])
def test_kernels_write_into_the_given_buffers_bitwise(global_scale, out, one_read):
    from fp4_compile.codegen.nvfp4.quantize_kernel import quantize_triton

    w = _weight(3, 32, 64) if global_scale == "per_expert" else _weight(48, 64)
    kw = dict(block="16x16", global_scale=global_scale, out=out, one_read_weights=one_read)
    want = quantize_triton(w, **kw)
    b = _buffers(w, packed=out != "ongrid", ongrid=out != "packed")
    scale_bytes = b["scales"].view(torch.uint8) if out != "ongrid" else None
    into = (b["codes"] if out != "ongrid" else None, scale_bytes, b["ongrid"])
    ptrs = [t.data_ptr() for t in into if t is not None]
    got = quantize_triton(w, **kw, into=into)
    if out == "ongrid":
        assert_bitwise_equal(b["ongrid"], want[0], "on-grid into")
        assert_bitwise_equal(got[1], want[1], "global decode")
    else:
        q, wq = (got[0], want[0]) if out == "both" else (got, want)
        assert_bitwise_equal(b["codes"], wq.codes, "codes into")
        assert_bitwise_equal(b["scales"], wq.block_scales, "scales into")
        assert q.codes.data_ptr() == b["codes"].data_ptr()
        if out == "both":
            assert_bitwise_equal(b["ongrid"], want[1], "on-grid into")
    assert [t.data_ptr() for t in into if t is not None] == ptrs


@pytest.mark.parametrize(
    "packed, ongrid",
    [(True, False), (True, True), (False, True)],
    ids=["packed", "both", "ongrid_only"],
)
@pytest.mark.parametrize("global_scale", ["per_tensor", "per_expert", "shared"])
def test_quantize_into_writes_what_the_op_returns(packed, ongrid, global_scale):
    ops = torch.ops.fp4_compile
    w = _weight(3, 32, 64, seed=1) if global_scale == "per_expert" else _weight(32, 64, seed=1)
    amax = w.float().abs().amax() * 1.5 if global_scale == "shared" else None
    args = (w, "16x16", global_scale, amax, "rne", 0)
    want = ops.quantize_with_ongrid(*args, packed) if ongrid else ops.quantize(*args)
    b = _buffers(w, packed=packed, ongrid=ongrid)
    b["global_decode"] = torch.empty_like(want[2])
    before = {k: t.data_ptr() for k, t in b.items() if t is not None}
    quantize_into(*args, **b)
    for name, got, exp in zip(
        ("codes", "scales", "global_decode", "ongrid"),
        (b["codes"], b["scales"], b["global_decode"], b["ongrid"]),
        want,
    ):
        assert got.shape == exp.shape, name
        assert_bitwise_equal(got, exp, name)
    assert {k: t.data_ptr() for k, t in b.items() if t is not None} == before


def test_quantize_into_needs_something_to_write():
    w = _weight(32, 64)
    b = _buffers(w, packed=False, ongrid=False)
    with pytest.raises(ValueError, match="packed codes or an on-grid buffer"):
        quantize_into(w, "16x16", "per_tensor", None, "rne", 0, global_decode=torch.empty(()), **b)


@needs_kernels
@pytest.mark.parametrize("out", ["ongrid", "both"])
def test_one_read_expert_kernel_writes_into_the_given_buffers(out):
    """The experts' one-read form (taken where `configs.LAUNCH` names expert groups)."""
    from fp4_compile.codegen.nvfp4.weight_quantize_kernel import quantize_weight_tiles

    w = _weight(3, 32, 64, seed=2)
    want = quantize_weight_tiles(w, "per_expert", out=out, expert_groups=2)
    b = _buffers(w, packed=out == "both", ongrid=True)
    into = (b["codes"], b["scales"].view(torch.uint8), b["ongrid"])
    got = quantize_weight_tiles(w, "per_expert", out=out, expert_groups=2, into=into)
    assert_bitwise_equal(b["ongrid"], want[0] if out == "ongrid" else want[1], "on-grid into")
    if out == "both":
        assert_bitwise_equal(b["codes"], want[0].codes, "codes into")
        assert_bitwise_equal(b["scales"], want[0].block_scales, "scales into")
        assert_bitwise_equal(got[0].global_decode, want[0].global_decode, "global decode")
