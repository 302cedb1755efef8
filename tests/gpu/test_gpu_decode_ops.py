"""The decode program's fused ops on the GPU (compiled Triton kernels) against the CUDA torch ops
they replaced, at Qwen3's vocabulary (151,936) and decode batch sizes.

Bitwise:
- the in-kernel Gumbel log-logs (`gumbel_noise_kernel.gumbel_loglog`: libdevice's FP64 log)
  == torch's CUDA `torch.log(-torch.log(u))`, every value's bytes at the full vocabulary;
- `sample_argmax`'s picks (the noise made in the kernel) == argmax(logits.float() / T +
  gumbel_noise) and the greedy argmax(logits.float()), as ATen computes them on the same device
  (its division by a host scalar multiplies by the FP32 reciprocal: the kernel must match it,
  not IEEE division), per-row and shared draw numbers, batch 1 and 64;
- `decode_advance` == the old bookkeeping's torch ops on every buffer, over several steps;
- `kv_cache_write` == the two `index_put_` it replaced (both whole caches, Qwen3-8B's 8 KV heads
  of 128, decode and prefill rows, v a transposed view), and through a block table into page
  pools == the `index_put_` of the pages' slots;
- `invariant_rms_norm_pair` == two `invariant_rms_norm` (the q / k norms at decode and prefill
  row counts).
"""

import pytest
import torch

from fp4_compile.rollout.sampling import gumbel_noise, gumbel_uniforms_reference, request_keys
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.gpu

DEVICE = "cuda"
VOCAB = 151936


def test_kernel_loglog_equals_torchs_cuda_logs_bitwise():
    """Contract: libdevice's FP64 log (Triton) == ATen's CUDA FP64 log (the CUDA math library's
    `log(double)`), bytes of log(-log(u)) at every token of 64 rows and several draws."""
    from fp4_compile.codegen.invariant.gumbel_noise_kernel import gumbel_uniforms

    keys = request_keys(list(range(64)), DEVICE)
    for step in (0, 1, 17, 2**31 + 3):
        n = torch.full((64,), step, dtype=torch.int64, device=DEVICE) + torch.arange(
            64, device=DEVICE
        )
        u = gumbel_uniforms_reference(keys, n, VOCAB)
        want = torch.log(-torch.log(u))
        got = gumbel_uniforms(keys, n, VOCAB, loglog=True)
        assert_bitwise_equal(got, want, f"log(-log(u)) at draw {step}")


@pytest.mark.parametrize("rows", [1, 64])
@pytest.mark.parametrize("temperature", [1.0, 0.7, 0.6, 1.3])
def test_sample_argmax_equals_the_torch_ops(rows, temperature):
    """Contract: the picks == the torch ops' (bytes), every call (the kernel resets its
    scratch), per-row and shared draw numbers."""
    g = torch.Generator(device=DEVICE).manual_seed(rows)
    logits = (torch.randn(rows, VOCAB, generator=g, device=DEVICE) * 4).to(torch.bfloat16)
    keys = request_keys(list(range(rows)), DEVICE)
    for step in range(8):  # many draws: a wrong last bit of the scale flips some picks
        for n in (torch.full((rows,), step, device=DEVICE), torch.tensor(step, device=DEVICE)):
            want = torch.argmax(logits.float() / temperature + gumbel_noise(keys, n, VOCAB), -1)
            got = torch.ops.fp4_compile.sample_argmax(logits, keys, n, temperature)
            assert_bitwise_equal(got, want, f"picks at step {step}, T={temperature}")
    greedy = torch.ops.fp4_compile.sample_argmax(logits, None, None, 1.0)
    assert_bitwise_equal(greedy, torch.argmax(logits.float(), dim=-1), "greedy picks")


def test_sample_argmax_scale_is_atens_reciprocal_form():
    """The division the kernel follows: ATen's CUDA `x / T` == x * FP32(1 / FP32(T))."""
    from fp4_compile.codegen.invariant.decode_reference import scale_logits

    x = torch.randn(4, VOCAB, device=DEVICE)
    for t in (0.7, 0.6, 1.3):
        assert_bitwise_equal(x / t, scale_logits(x, t, reciprocal=True), f"x / {t}")


def _bookkeeping_state(rows, cols, seed):
    g = torch.Generator().manual_seed(seed)
    n = torch.randint(0, cols - 2, (rows,), generator=g)  # budgets below cols, as a program's
    s = dict(
        picked=torch.randint(0, 9, (rows,), generator=g),
        logp=-torch.rand(rows, generator=g),
        eos=torch.tensor(7),
        budget=n + torch.randint(1, 3, (rows,), generator=g),
        tokens=torch.zeros(rows, cols, dtype=torch.int64),
        logps=torch.zeros(rows, cols),
        n=n,
        finished=torch.rand(rows, generator=g) < 0.3,
        ids=torch.randint(0, 9, (rows, 1), generator=g),
        positions=torch.randint(0, 50, (rows, 1), generator=g),
        kv_len=torch.randint(1, 50, (rows,), generator=g),
    )
    return {k: v.to(DEVICE) for k, v in s.items()}


@pytest.mark.parametrize("rows", [1, 64, 300])
def test_decode_advance_equals_the_torch_ops(rows):
    want, got = (_bookkeeping_state(rows, 9, seed=rows) for _ in range(2))
    for _ in range(3):
        w = want
        live = ~w["finished"]
        w["tokens"].scatter_(1, w["n"][:, None], w["picked"][:, None])
        w["logps"].scatter_(1, w["n"][:, None], w["logp"][:, None])
        w["n"].add_(live)
        w["finished"] |= live & ((w["picked"] == w["eos"]) | (w["n"] >= w["budget"]))
        running = ~w["finished"]
        w["ids"].copy_(torch.where(running, w["picked"], w["ids"][:, 0])[:, None])
        w["positions"].add_(running[:, None])
        w["kv_len"].add_(running)
        torch.ops.fp4_compile.decode_advance(**got)
    for name in want:
        assert_bitwise_equal(got[name], want[name], name)


@pytest.mark.parametrize("tokens", [1, 64, 512, 4096])
def test_expert_order_equals_the_torch_ops(tokens):
    """`fp4_compile::expert_order` (one Triton launch up to 4096 slots; past them the torch
    path) == its reference's torch ops on the CUDA tensors, every output bitwise, at
    Qwen3-30B-A3B's routing (128 experts, top 8) and the router's FP32 weights cast to BF16."""
    from fp4_compile.codegen.moe.reference import expert_order_reference

    g = torch.Generator(device=DEVICE).manual_seed(tokens)
    logits = torch.randn(tokens, 128, generator=g, device=DEVICE)
    weights, experts = torch.ops.fp4_compile.invariant_routing(logits, 8, True)
    got = torch.ops.fp4_compile.expert_order(experts, weights, 128, torch.bfloat16)
    want = expert_order_reference(experts, weights, 128, torch.bfloat16)
    for i, (a, b) in enumerate(zip(got, want)):
        assert_bitwise_equal(a, b, f"output {i} at {tokens} tokens")


@pytest.mark.parametrize(("batch", "tq"), [(1, 1), (64, 1), (2, 300)])
def test_kv_cache_write_equals_two_index_puts(batch, tq):
    g = torch.Generator(device=DEVICE).manual_seed(batch + tq)
    heads, slots, dim = 8, 512, 128
    caches = [
        torch.randn(batch, heads, slots, dim, generator=g, device=DEVICE).bfloat16()
        for _ in range(2)
    ]
    keys = torch.rand(batch, slots, generator=g, device=DEVICE)
    positions = keys.argsort(dim=1)[:, :tq].contiguous()  # distinct slots per sequence
    k = torch.randn(batch, heads, tq, dim, generator=g, device=DEVICE).bfloat16()
    v = torch.randn(batch, tq, heads, dim, generator=g, device=DEVICE).bfloat16().transpose(1, 2)
    index = (
        torch.arange(batch, device=DEVICE)[:, None, None],
        torch.arange(heads, device=DEVICE)[None, :, None],
        positions[:, None, :],
    )
    want = [caches[0].clone().index_put_(index, k), caches[1].clone().index_put_(index, v)]
    torch.ops.fp4_compile.kv_cache_write(*caches, positions, k, v)
    assert_bitwise_equal(caches[0], want[0], "k cache")
    assert_bitwise_equal(caches[1], want[1], "v cache")


@pytest.mark.parametrize(("batch", "tq"), [(1, 1), (64, 1), (2, 300)])
def test_paged_kv_cache_write_equals_index_puts_of_the_pages(batch, tq):
    g = torch.Generator(device=DEVICE).manual_seed(batch * tq)
    heads, page, dim, width = 8, 64, 128, 8  # 8 pages of 64 per sequence, 512 positions
    pages = 1 + batch * width
    pools = [
        torch.randn(pages, heads, page, dim, generator=g, device=DEVICE).bfloat16()
        for _ in range(2)
    ]
    table = 1 + torch.randperm(pages - 1, generator=g, device=DEVICE).view(batch, width)
    keys = torch.rand(batch, page * width, generator=g, device=DEVICE)
    positions = keys.argsort(dim=1)[:, :tq].contiguous()
    k = torch.randn(batch, heads, tq, dim, generator=g, device=DEVICE).bfloat16()
    v = torch.randn(batch, tq, heads, dim, generator=g, device=DEVICE).bfloat16().transpose(1, 2)
    index = (
        torch.gather(table, 1, positions // page)[:, None, :],
        torch.arange(heads, device=DEVICE)[None, :, None],
        (positions % page)[:, None, :],
    )
    want = [pools[0].clone().index_put_(index, k), pools[1].clone().index_put_(index, v)]
    torch.ops.fp4_compile.kv_cache_write(*pools, positions, k, v, table)
    assert_bitwise_equal(pools[0], want[0], "k pool")
    assert_bitwise_equal(pools[1], want[1], "v pool")


@pytest.mark.parametrize("tokens", [1, 64, 4096])
def test_rms_norm_pair_equals_two_norms(tokens):
    g = torch.Generator(device=DEVICE).manual_seed(tokens)
    q = torch.randn(tokens, 32, 128, generator=g, device=DEVICE).bfloat16() * 3
    k = torch.randn(tokens, 8, 128, generator=g, device=DEVICE).bfloat16() * 0.01
    wq, wk = (1 + 0.1 * torch.randn(2, 128, generator=g, device=DEVICE)).bfloat16()
    got = torch.ops.fp4_compile.invariant_rms_norm_pair(q, wq, k, wk, 1e-6)
    assert_bitwise_equal(got[0], torch.ops.fp4_compile.invariant_rms_norm(q, wq, 1e-6), "q")
    assert_bitwise_equal(got[1], torch.ops.fp4_compile.invariant_rms_norm(k, wk, 1e-6), "k")
