"""fp4_compile::invariant_rms_norm_pair_rotary (the q / k norms and the rotary after them in one
launch).

Tiers: bitwise (the op == invariant_rms_norm_pair followed by transformers' own
`apply_rotary_pos_emb` on the transposed heads with the rotary embedding's cast tables: CPU op;
the Triton kernel in the interpreter == the interpreted norm pair kernel followed by those torch
ops, and == the CPU op; odd head dims, batch > 1, q / k read in place as strided heads of a fused
q/k/v output, FP32 and bf16 tables, tables per sequence or one set for all (batch 1), attention
scaling 1 and not); a check that the contract can
fail (one rounding instead of three differs); integration (opcheck); bad input names the
argument.
"""

import pytest
import torch
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

from fp4_compile.codegen.runtime import interpreting
from fp4_compile.testing import assert_bitwise_equal

ops = torch.ops.fp4_compile
BF16 = torch.bfloat16


def _heads(b=3, t=2, hq=5, hk=2, d=96, seed=0):
    """q [B, T, Hq, D], k [B, T, Hk, D] as strided views of one fused q/k/v output, rows of very
    different size, the norms' weights, and FP32 rotary tables [B, T, D] of positions up to 4k."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(b, t, (hq + 2 * hk) * d, generator=g) * 4
    qkv = qkv * torch.logspace(-2, 2, hq + 2 * hk).repeat_interleave(d)
    qkv = qkv.to(BF16)
    q = qkv[..., : hq * d].view(b, t, hq, d)
    k = qkv[..., hq * d : (hq + hk) * d].view(b, t, hk, d)
    wq, wk = (1.0 + 0.3 * torch.randn(2, d, generator=g)).to(BF16)
    inv_freq = 1.0 / (1e6 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    pos = torch.randint(0, 4096, (b, t), generator=g).float()
    emb = torch.cat([pos[..., None] * inv_freq] * 2, dim=-1)
    return q, k, wq, wk, emb.cos(), emb.sin()


def _unfused(pair, q, wq, k, wk, cos, sin, scaling):
    """The graph's ops: the norm pair, the rotary embedding's (t * scaling).to(dtype), the heads
    transposed, transformers' apply_rotary_pos_emb."""
    yq, yk = pair(q, wq, k, wk, 1e-6)
    c, s = (cos * scaling).to(q.dtype), (sin * scaling).to(q.dtype)
    return apply_rotary_pos_emb(yq.transpose(1, 2), yk.transpose(1, 2), c, s)


CASES = [  # (table dtype, scaling, weighted, tables of batch 1: every sequence's positions alike)
    (torch.float32, 1.0, True, False),
    (torch.float32, 0.7, True, False),
    (BF16, 1.0, True, False),
    (torch.float32, 1.0, False, False),
    (torch.float32, 1.0, True, True),
]


@pytest.mark.parametrize(("tables", "scaling", "weighted", "one_batch"), CASES)
@pytest.mark.parametrize("d", [128, 96, 6])
def test_op_equals_norm_pair_then_rotary_bitwise(tables, scaling, weighted, one_batch, d):
    """Bitwise (CPU op): q_embed and k_embed == the unfused ops', contiguous [B, H, T, D]."""
    q, k, wq, wk, cos, sin = _heads(d=d)
    wq, wk = (wq, wk) if weighted else (None, None)
    cos, sin = (t[:1] if one_batch else t for t in (cos.to(tables), sin.to(tables)))
    got = ops.invariant_rms_norm_pair_rotary(q, wq, k, wk, 1e-6, cos, sin, scaling)
    want = _unfused(ops.invariant_rms_norm_pair, q, wq, k, wk, cos, sin, scaling)
    for a, b, what in zip(got, want, ("q_embed", "k_embed")):
        assert a.is_contiguous() and a.shape == b.shape, (what, a.shape, b.shape)
        assert_bitwise_equal(a, b, what)


def test_one_rounding_differs():
    """The contract can fail: the rotary with ONE rounding (q * c + rotate_half(q) * s in FP32,
    as a fused multiply-add would) differs from the three-rounding graph on these inputs."""
    q, k, wq, wk, cos, sin = _heads(b=4, t=8)
    yq = ops.invariant_rms_norm_pair(q, wq, k, wk, 1e-6)[0].transpose(1, 2).float()
    c, s = (t.to(BF16).float().unsqueeze(1) for t in (cos, sin))
    rot = torch.cat((-yq[..., 48:], yq[..., :48]), dim=-1)
    one = (yq * c + rot * s).to(BF16)
    got = ops.invariant_rms_norm_pair_rotary(q, wq, k, wk, 1e-6, cos, sin, 1.0)[0]
    assert (one.view(torch.int16) != got.view(torch.int16)).sum() > 0


@pytest.mark.skipif(
    torch.cuda.is_available() or not interpreting(), reason="interpreter test (CPU only)"
)
@pytest.mark.parametrize(
    ("tables", "scaling", "weighted", "one_batch", "d", "b", "t"),
    # every case at the real head size and at the tiny odd one; head size 96 (a masked block
    # of 128) with the plain case and the batch-1 tables
    [(*c, *s) for s in [(128, 3, 2), (6, 1, 1)] for c in CASES]
    + [(*CASES[0], 96, 2, 3), (*CASES[4], 96, 2, 3)],
)
def test_kernel_equals_norm_pair_kernel_then_rotary_interpreter(
    tables, scaling, weighted, one_batch, d, b, t
):
    """Bitwise (interpreter): the kernel == the norm pair kernel followed by the rotary's torch
    ops, and == the CPU op; q and k read in place (no copy) as strided heads at batch > 1."""
    from fp4_compile.codegen.invariant.rms_norm_kernel import rms_norm_pair
    from fp4_compile.codegen.invariant.rms_norm_rotary_kernel import rms_norm_pair_rotary

    q, k, wq, wk, cos, sin = _heads(b=b, t=t, d=d, seed=d)
    wq, wk = (wq, wk) if weighted else (None, None)
    cos, sin = (x[:1] if one_batch else x for x in (cos.to(tables), sin.to(tables)))
    got = rms_norm_pair_rotary(q, wq, k, wk, 1e-6, cos, sin, scaling)
    want = _unfused(rms_norm_pair, q, wq, k, wk, cos, sin, scaling)
    cpu = ops.invariant_rms_norm_pair_rotary(q, wq, k, wk, 1e-6, cos, sin, scaling)
    for a, w, c, what in zip(got, want, cpu, ("q_embed", "k_embed")):
        assert a.is_contiguous() and a.shape == w.shape
        assert_bitwise_equal(a, w, f"{what}: kernel vs norm pair kernel + rotary")
        assert_bitwise_equal(a, c, f"{what}: kernel vs CPU op")


@pytest.mark.skipif(
    torch.cuda.is_available() or not interpreting(), reason="interpreter test (CPU only)"
)
def test_kernel_reads_strided_heads_in_place(monkeypatch):
    """No copy of q or k (rows in blocks of a fused q/k/v output), the bits of contiguous ones."""
    from fp4_compile.codegen.invariant.rms_norm_rotary_kernel import rms_norm_pair_rotary

    q, k, wq, wk, cos, sin = _heads(b=3, t=1, d=128)
    want = rms_norm_pair_rotary(q.contiguous(), wq, k.contiguous(), wk, 1e-6, cos, sin, 1.0)
    copies = []
    contiguous = torch.Tensor.contiguous

    def counting(t, *args, **kwargs):
        copies.append(not t.is_contiguous())
        return contiguous(t, *args, **kwargs)

    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "contiguous", counting)
        got = rms_norm_pair_rotary(q, wq, k, wk, 1e-6, cos, sin, 1.0)
    assert not any(copies), "q, k or a table was copied"
    for a, b, what in zip(got, want, ("q_embed", "k_embed")):
        assert_bitwise_equal(a, b, f"{what}: read in place vs contiguous")


def test_opcheck():
    """torch.library.opcheck: schema, fake tensors, aot dispatch (no autograd: inference op)."""
    q, k, wq, wk, cos, sin = _heads(d=32)
    for args in ((q, wq, k, wk, 1e-6, cos, sin, 1.0), (q, None, k, None, 1e-6, cos, sin, 0.5)):
        torch.library.opcheck(ops.invariant_rms_norm_pair_rotary.default, args)


def test_bad_input_names_the_argument():
    q, k, wq, wk, cos, sin = _heads(d=32)
    f = ops.invariant_rms_norm_pair_rotary
    with pytest.raises(ValueError, match="row length"):
        f(q, wq, k[..., :16], wk[:16], 1e-6, cos, sin, 1.0)
    with pytest.raises(ValueError, match="b_weight"):
        f(q, wq, k, None, 1e-6, cos, sin, 1.0)
    with pytest.raises(ValueError, match="sin must be"):
        f(q, wq, k, wk, 1e-6, cos, sin[:, :1], 1.0)
    with pytest.raises(ValueError, match="sin must be"):
        f(q, wq, k, wk, 1e-6, cos, sin[:1], 1.0)
    with pytest.raises(ValueError, match="cos must be"):
        f(q, wq, k, wk, 1e-6, cos.double(), sin, 1.0)
    with pytest.raises(ValueError, match="even"):
        f(q[..., :31], wq[:31], k[..., :31], wk[:31], 1e-6, cos[..., :31], sin[..., :31], 1.0)
    with pytest.raises(ValueError, match=r"\[B, T, heads, D\]"):
        f(q[0], wq, k[0], wk, 1e-6, cos[0], sin[0], 1.0)
