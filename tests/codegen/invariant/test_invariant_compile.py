"""The invariant ops under torch.compile(fullgraph=True) and torch.export on CPU.

Contract, bitwise: a compiled or exported block of invariant ops gives the same bits as eager
(the ops are opaque custom ops, so the compiler cannot reorder their reductions), and the
backward compiles too.
"""

from __future__ import annotations

import torch

from fp4_compile.codegen.invariant import api as inv
from fp4_compile.testing import assert_bitwise_equal


class Block(torch.nn.Module):
    """norm -> q/k/v projections -> attention -> residual norm -> lm_head -> logprobs, router."""

    def __init__(self, hidden=64, heads=4, kv_heads=2, vocab=300, experts=8):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.heads, self.kv_heads, self.hd = heads, kv_heads, hidden // heads
        self.norm = torch.nn.Parameter(torch.randn(hidden, generator=g))
        self.wq = torch.nn.Parameter(torch.randn(hidden, hidden, generator=g) * 0.1)
        self.wkv = torch.nn.Parameter(
            torch.randn(2 * kv_heads * self.hd, hidden, generator=g) * 0.1
        )
        self.lm_head = torch.nn.Parameter(torch.randn(vocab, hidden, generator=g) * 0.1)
        self.router = torch.nn.Parameter(torch.randn(experts, hidden, generator=g) * 0.1)

    def forward(self, x, tokens, lengths):
        b, t, h = x.shape
        n = inv.rms_norm(x, self.norm, 1e-6)
        q = inv.linear(n, self.wq).reshape(b, t, self.heads, self.hd).transpose(1, 2)
        kv = inv.linear(n, self.wkv).reshape(b, t, 2, self.kv_heads, self.hd)
        k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)
        a = inv.attention(q.contiguous(), k.contiguous(), v.contiguous(), kv_len=lengths)
        n2, hres = inv.rms_norm(a.transpose(1, 2).reshape(b, t, h), self.norm, 1e-6, residual=x)
        logits = inv.linear(n2, self.lm_head, out_dtype=torch.float32)
        logp, ent = inv.logprobs(logits, tokens, 0.9)
        w, idx = inv.route(inv.linear(hres.reshape(-1, h), self.router), 2)
        return logp, ent, w, idx


def _inputs():
    g = torch.Generator().manual_seed(1)
    return (
        torch.randn(2, 24, 64, generator=g).bfloat16(),
        torch.randint(0, 300, (2, 24), generator=g),
        torch.tensor([24, 17]),
    )


def test_compile_fullgraph_matches_eager_and_trains():
    """Dynamo + AOTAutograd (aot_eager: the ops and their fake/autograd registrations; Inductor
    codegen is the minite backend's concern and slow to build on CPU)."""
    torch._dynamo.reset()
    model = Block().bfloat16()
    x, tokens, lengths = _inputs()
    eager = model(x, tokens, lengths)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    out = compiled(x, tokens, lengths)
    for a, b, name in zip(out, eager, ("logp", "entropy", "weights", "experts")):
        assert_bitwise_equal(a, b, f"compiled {name}")
    loss = out[0].sum() + out[1].sum() + out[2].sum()
    loss.backward()
    assert all(
        p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters()
    )


def test_export_matches_eager():
    model = Block().bfloat16()
    x, tokens, lengths = _inputs()
    eager = model(x, tokens, lengths)
    program = torch.export.export(model, (x, tokens, lengths))
    names = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    for op in (
        "invariant_linear",
        "invariant_attention",
        "invariant_logprobs",
        "invariant_routing",
        "invariant_rms_norm",
        "invariant_add_rms_norm",
    ):
        assert any(op in name for name in names), f"{op} missing from the exported graph"
    for a, b in zip(program.module()(x, tokens, lengths), eager):
        assert_bitwise_equal(a, b, "exported")
