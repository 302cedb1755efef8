"""passes/emit_attention_parts.py: a BF16 decode attention (Tq = 1) whose out reaches only the
output projection's `nvfp4_linear` through views / transposes / contiguous copies (the heads
concatenated per token) becomes `invariant_attention_parts`, the linear
`nvfp4_linear_with_parts` reading its per-head maxima; the graph's outputs stay bitwise the same
(CPU references). Refusals: the lse read, Tq > 1, FP32, another reader of out, a chain whose
rows are not the tokens' heads. Tier: bitwise + op counts."""

import torch
import torch.fx as fx
from torch._subclasses import FakeTensorMode
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.passes import LoweringReport, emit_attention_parts
from fp4_compile.testing import assert_bitwise_equal

ops = torch.ops.fp4_compile
KEY = NVFP4Recipe.strict().numerics_key
B, HQ, HKV, D, TK = 3, 4, 2, 32, 20


def _attention(q, k, v, qs, kl):
    return ops.invariant_attention.default(q, k, v, qs, kl, None, False, 0.25)


def _linear(x, weight, codes, scales, gd):
    return ops.nvfp4_linear.default(x, weight, codes, scales, gd, None, None, KEY, None, 0)


def _heads(o, tq=1):
    """transformers' attention output: [B, Hq, Tq, D] -> [B, Tq, Hq * D]."""
    return o.reshape(B, -1, tq, D).transpose(1, 2).contiguous().reshape(B, tq, -1).contiguous()


def _decode(q, k, v, qs, kl, weight, codes, scales, gd):
    return (_linear(_heads(_attention(q, k, v, qs, kl)[0]), weight, codes, scales, gd),)


def _lse_read(q, k, v, qs, kl, weight, codes, scales, gd):
    att = _attention(q, k, v, qs, kl)
    return _linear(_heads(att[0]), weight, codes, scales, gd), att[1]


def _out_read(q, k, v, qs, kl, weight, codes, scales, gd):
    o = _attention(q, k, v, qs, kl)[0]
    return _linear(_heads(o), weight, codes, scales, gd), o * 2


def _mixed_rows(q, k, v, qs, kl, weight, codes, scales, gd):
    """Rows that are not one token's heads: head-major, cut into B rows."""
    o = _attention(q, k, v, qs, kl)[0]
    return (_linear(o.transpose(0, 1).contiguous().reshape(B, -1), weight, codes, scales, gd),)


def _prefill(q, k, v, qs, kl, weight, codes, scales, gd):
    return (_linear(_heads(_attention(q, k, v, qs, kl)[0], tq=2), weight, codes, scales, gd),)


def _inputs(tq=1, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, HQ, tq, D, generator=g).to(dtype)
    k = torch.randn(B, HKV, TK, D, generator=g).to(dtype)
    v = (torch.randn(B, HKV, TK, D, generator=g) * 3).to(dtype)
    kl = torch.tensor([TK, 7, 2], dtype=torch.int32)
    weight = torch.randn(48, HQ * D, generator=g)
    wq = ref.quantize(weight, block="16x16")
    return q, k, v, kl - tq, kl, weight, wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode  # fmt: skip


def _run(fn, inputs):
    gm = fx.symbolic_trace(fn)
    mode = FakeTensorMode()
    FakeTensorProp(gm, mode).propagate(*(mode.from_tensor(t) for t in inputs))
    want = gm(*inputs)
    report = LoweringReport(recipe_fingerprint="t")
    done = emit_attention_parts(gm.graph, report)
    gm.graph.lint()
    gm.recompile()
    got = gm(*inputs)
    for i, (a, b) in enumerate(zip(got, want)):
        assert_bitwise_equal(a, b, f"output {i}")
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    return done, report, targets


def test_fires_on_a_decode_attention_read_by_its_output_projection():
    done, report, targets = _run(_decode, _inputs())
    assert done == 1 and report.counts["attention_parts_emitted"] == 1
    assert targets.count(ops.invariant_attention_parts.default) == 1
    assert targets.count(ops.nvfp4_linear_with_parts.default) == 1
    assert ops.invariant_attention.default not in targets
    assert ops.nvfp4_linear.default not in targets


def _refused(fn, why, inputs=None):
    done, report, targets = _run(fn, inputs or _inputs())
    assert done == 0 and ops.invariant_attention_parts.default not in targets
    assert ops.nvfp4_linear.default in targets
    assert any(why in note for note in report.notes), report.notes


def test_refuses_the_lse_read():
    _refused(_lse_read, "other than its out alone")


def test_refuses_another_reader_of_out():
    _refused(_out_read, "read by other ops")


def test_refuses_rows_that_are_not_the_tokens_heads():
    _refused(_mixed_rows, "not the tokens' heads")


def test_refuses_prefill_and_fp32():
    _refused(_prefill, "Tq = 1", _inputs(tq=2))
    _refused(_decode, "not a BF16 decode", _inputs(dtype=torch.float32))
