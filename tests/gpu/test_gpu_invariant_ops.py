"""Batch-invariant ops on the GPU (the Triton kernels behind `fp4_compile::invariant_*`), at the
Qwen3-30B-A3B shapes (hidden 2048, 32 query / 4 key-value heads of 128, vocab 151936, 128 experts).

Bitwise: rows of op(x[:m]) == rows of op(x) for m up to 256 (linear, RMSNorm, log-probs,
routing); attention's decode against a static cache == the full forward at that position, across
block boundaries; chunked prefill == one piece; a sequence alone == inside a ragged batch.
Error budgets against float64 where bitwise is not the contract (log-probs, attention), and the
routing kernel against the CPU construction. Speed: `python -m benchmarks.invariant`.
"""

import gpu_internals as gi
import pytest
import torch
import torch.nn.functional as F

from fp4_compile import codegen
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
HQ, HKV, D, HIDDEN, VOCAB, EXPERTS = 32, 4, 128, 2048, 151936, 128
ROWS = (1, 2, 3, 7, 16, 64, 129, 256)
BATCH, T, S_MAX = 2, 1024, 2048  # attention


def _rnd(*shape, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    return torch.randn(*shape, device=DEVICE, generator=g)


def _assert_rows_invariant(op, x):
    full = op(x)
    fulls = full if isinstance(full, tuple) else (full,)
    for m in ROWS:
        part = op(x[:m])
        parts = part if isinstance(part, tuple) else (part,)
        for j, (a, b) in enumerate(zip(parts, fulls)):
            assert_bitwise_equal(a, b[:m], f"output {j}, rows of op(x[:{m}]) vs op(x)")


def _linear(n):
    w = (_rnd(n, HIDDEN, seed=n) * 0.02).bfloat16()
    return lambda a: codegen.linear(a, w, out_dtype=torch.float32)


def _rms_norm(residual):
    w = _rnd(HIDDEN, seed=1).bfloat16()
    if residual:
        return lambda a: codegen.rms_norm(a, w, 1e-6, residual=a * 0.5)
    return lambda a: codegen.rms_norm(a, w, 1e-6)


ROW_OPS = {
    "linear q_proj": lambda: _linear(4096),
    "linear router": lambda: _linear(EXPERTS),
    "linear lm_head": lambda: _linear(VOCAB),
    "rms_norm": lambda: _rms_norm(False),
    "add_rms_norm": lambda: _rms_norm(True),
}


@pytest.mark.parametrize("name", list(ROW_OPS))
def test_rows_invariant(name):
    """Bitwise: rows of op(x[:m]) == the same rows of op(x), m in ROWS (linear: BF16 in, FP32
    out, N = 4096 / 128 / 151936; RMSNorm with and without the fused residual add)."""
    _assert_rows_invariant(ROW_OPS[name](), _rnd(256, HIDDEN, seed=2).bfloat16())


def _logits_and_tokens():
    logits = (_rnd(256, VOCAB, seed=3) * 3).bfloat16()
    g = torch.Generator(device=DEVICE).manual_seed(4)
    return logits, torch.randint(0, VOCAB, (256,), device=DEVICE, generator=g)


def test_logprobs_rows_invariant():
    """Bitwise: log-probs (and the op's second output) of logits[:m] == rows of the full call,
    V = 151936, temperature 0.7."""
    logits, tokens = _logits_and_tokens()
    _assert_rows_invariant(lambda a: codegen.logprobs(a, tokens[: a.shape[0]], 0.7), logits)


def test_logprobs_within_budget_of_float64():
    """Error budget: log-probs within 1e-4 of log_softmax in float64."""
    logits, tokens = _logits_and_tokens()
    lp, _ = codegen.logprobs(logits, tokens, 0.7)
    want = torch.log_softmax(logits.double() / 0.7, -1).gather(-1, tokens[:, None])[:, 0]
    err = (lp.double() - want).abs()
    assert float(err.max()) < 1e-4, f"{int((err >= 1e-4).sum())} log-probs off by >= 1e-4"


def _router_logits():
    x = _rnd(256, HIDDEN, seed=2).bfloat16()
    return codegen.linear(x, (_rnd(EXPERTS, HIDDEN, seed=5) * 0.02).bfloat16())


def test_routing_rows_invariant():
    """Bitwise: top-8 routing (weights and experts) of logits[:m] == rows of the full call."""
    _assert_rows_invariant(lambda a: codegen.route(a, 8), _router_logits())


def test_routing_kernel_equals_cpu_construction():
    """The routing kernel picks the same experts as the CPU construction (exact), with weights
    within 2e-6."""
    logits = _router_logits()
    w_gpu, i_gpu = codegen.route(logits, 8)
    w_cpu, i_cpu = gi.invariant_reference.routing(logits.cpu(), 8, True)
    assert_bitwise_equal(i_gpu.cpu(), i_cpu, "chosen experts")
    err = float((w_gpu.cpu() - w_cpu).abs().max())
    assert err <= 2e-6, f"routing weights: max |dw| {err:.3g} > 2e-6"


@pytest.fixture(scope="module")
def qkv():
    """Causal attention inputs [B, H, T, D] and the one-call forward."""
    q, k, v = (_rnd(BATCH, h, T, D, seed=10 + i).bfloat16() for i, h in enumerate((HQ, HKV, HKV)))
    return q, k, v, codegen.attention(q, k, v)


def test_attention_within_budget_of_float64(qkv):
    """Error budget: attention's max error against float64 SDPA is at most twice that of SDPA
    in BF16."""
    q, k, v, full = qkv
    oracle = F.scaled_dot_product_attention(
        q.double(), k.double(), v.double(), is_causal=True, enable_gqa=True
    )
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    ours, theirs = (full.double() - oracle).abs().max(), (sdpa.double() - oracle).abs().max()
    assert ours <= 2 * theirs, f"max |err| {float(ours):.3g} > 2 x SDPA bf16's {float(theirs):.3g}"


def test_attention_decode_equals_full_forward(qkv):
    """Bitwise: decoding one query at position t against a static cache [B, 4, S_max, 128]
    == the full causal forward at t, at block boundaries and between them."""
    q, k, v, full = qkv
    kc = torch.zeros(BATCH, HKV, S_MAX, D, device=DEVICE, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    kc[:, :, :T], vc[:, :, :T] = k, v
    for pos in (0, 1, 63, 64, 65, 127, 128, 511, 777, T - 1):
        dec = codegen.attention(q[:, :, pos : pos + 1], kc, vc, q_start=pos, kv_len=pos + 1)
        assert_bitwise_equal(dec, full[:, :, pos : pos + 1], f"decode at position {pos}")


def test_attention_chunked_prefill_equals_one_piece(qkv):
    """Bitwise: prefill in chunks of 100, 412 and 512 queries == the one-piece forward."""
    q, k, v, full = qkv
    start = 0
    for n in (100, 412, T - 512):
        part = codegen.attention(q[:, :, start : start + n], k, v, q_start=start, kv_len=start + n)
        assert_bitwise_equal(part, full[:, :, start : start + n], f"chunk at {start}")
        start += n


def test_attention_sequence_alone_equals_ragged_batch(qkv):
    """Bitwise: a sequence alone == the same sequence inside a ragged batch of 8 (kv_len per
    sequence)."""
    q, k, v, full = qkv
    lens = torch.tensor([T, 300, 77, 1000, 5, 640, T, 333], device=DEVICE)
    qb, kb, vb = (_rnd(8, h, T, D, seed=20 + i).bfloat16() for i, h in enumerate((HQ, HKV, HKV)))
    qb[0], kb[0], vb[0] = q[0], k[0], v[0]
    batch_out = codegen.attention(qb, kb, vb, kv_len=lens)
    assert_bitwise_equal(batch_out[:1], full[:1], "sequence 0 (full length)")
    for i in (1, 2, 4):
        n = int(lens[i])
        alone = codegen.attention(qb[i : i + 1, :, :n], kb[i : i + 1, :, :n], vb[i : i + 1, :, :n])
        assert_bitwise_equal(batch_out[i : i + 1, :, :n], alone, f"sequence {i} (length {n})")


def _repeat_kv(t):
    """transformers' repeat_kv (what the lowering copied before it read the KV heads in place)."""
    b, h, n, d = t.shape
    return t[:, :, None].expand(b, h, HQ // HKV, n, d).reshape(b, HQ, n, d)


def test_attention_kv_heads_in_place_equal_repeated(qkv):
    """Bitwise, compiled sm_90 kernels: attention reading the 4 KV heads in place (one program
    holds a group's 8 query heads) == attention on k, v repeated to 32 heads (one head per
    program): the causal forward, a decode step through the rollout's boolean mask over a static
    cache, and the gradients (per-query-head dK / dV summed per group in order, FP32, one
    rounding: what repeat_kv's backward computed)."""
    op = torch.ops.fp4_compile.invariant_attention.default
    q, k, v, _ = qkv
    zero = torch.zeros(BATCH, dtype=torch.int64, device=DEVICE)
    full = torch.full_like(zero, T)
    got = op(q, k, v, zero, full, None, True, D**-0.5)
    want = op(q, _repeat_kv(k), _repeat_kv(v), zero, full, None, True, D**-0.5)
    assert_bitwise_equal(got[0], want[0], "causal forward out")
    assert_bitwise_equal(got[1], want[1], "causal forward lse")
    kc = torch.zeros(BATCH, HKV, S_MAX, D, device=DEVICE, dtype=torch.bfloat16)
    vc = torch.zeros_like(kc)
    kc[:, :, :T], vc[:, :, :T] = k, v
    pos = torch.tensor([T - 1, 700], device=DEVICE)
    mask = (torch.arange(S_MAX, device=DEVICE)[None, :] <= pos[:, None])[:, None, None]
    qd = torch.stack([q[0, :, T - 1 : T], q[1, :, 700:701]])
    s_max = torch.full_like(zero, S_MAX)
    got = op(qd, kc, vc, zero, s_max, mask, False, D**-0.5)[0]
    want = op(qd, _repeat_kv(kc), _repeat_kv(vc), zero, s_max, mask, False, D**-0.5)[0]
    assert_bitwise_equal(got, want, "decode through the rollout's mask")
    go = _rnd(BATCH, HQ, T, D, seed=30).bfloat16()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    op(*leaves, zero, full, None, True, D**-0.5)[0].backward(go)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, _repeat_kv(k), _repeat_kv(v)))
    op(qr, kr, vr, zero, full, None, True, D**-0.5)[0].backward(go)

    def group_sum(g):
        parts = g.reshape(BATCH, HKV, HQ // HKV, T, D).float()
        acc = parts[:, :, 0]
        for r in range(1, HQ // HKV):
            acc = acc + parts[:, :, r]
        return acc.bfloat16()

    assert_bitwise_equal(leaves[0].grad, qr.grad, "dq")
    assert_bitwise_equal(leaves[1].grad, group_sum(kr.grad), "dk")
    assert_bitwise_equal(leaves[2].grad, group_sum(vr.grad), "dv")


def test_attention_mask_prepared_once_equals_inside_the_call(qkv):
    """Bitwise, compiled sm_90 kernels: `invariant_attention_mask_args` == its CPU reference,
    and the attention given its three tensors (what every layer of a lowered graph reads) ==
    the attention preparing the mask itself, forward and gradients: a left-padded causal mask
    (the interval path) and a random one (the bit path)."""
    from fp4_compile.codegen.invariant import reference as cpu

    op = torch.ops.fp4_compile.invariant_attention.default
    q, k, v, _ = qkv
    zero = torch.zeros(BATCH, dtype=torch.int64, device=DEVICE)
    full = torch.full_like(zero, T)
    tril = torch.ones(T, T, dtype=torch.bool, device=DEVICE).tril()
    keep = torch.ones(BATCH, T, dtype=torch.bool, device=DEVICE)
    keep[1, :300] = False
    g = torch.Generator(device=DEVICE).manual_seed(31)
    masks = {
        "left-padded causal": (tril[None] & keep[:, None, :])[:, None],
        "random": torch.rand(BATCH, 1, T, T, device=DEVICE, generator=g) < 0.7,
    }
    go = _rnd(BATCH, HQ, T, D, seed=32).bfloat16()
    for name, mask in masks.items():
        prepared = torch.ops.fp4_compile.invariant_attention_mask_args(mask, T, T)
        reference = cpu.attention_mask_args(mask.cpu(), T, T)
        for got, want, part in zip(prepared, reference, ("words", "intervals", "flag")):
            assert_bitwise_equal(got.cpu(), want, f"{name} {part}: kernel vs reference")
        runs = []
        for extra in (prepared, ()):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            out, lse = op(*leaves, zero, full, mask, False, D**-0.5, *extra)
            out.backward(go)
            runs.append((out, lse, *(t.grad for t in leaves)))
        for got, want, part in zip(*runs, ("out", "lse", "dq", "dk", "dv")):
            assert_bitwise_equal(got, want, f"{name} {part}: prepared once vs inside the call")
