"""The decode program's fused ops (codegen/invariant/sample_argmax*.py, decode_advance*.py)
against the torch ops they replace in `fp4_compile/rollout/decode_program.py`.

Tier: bitwise. The CPU ops are the old torch form (frozen below as it stood before the fusion);
the Triton kernels (interpreter on CPU, compiled on CUDA) equal the reference of the CUDA form
(`decode_reference`, reciprocal=True: ATen's CUDA division by a host scalar), bytes, on rows of
ties, NaNs and -inf, vocabularies that are not a multiple of the block, and rows alone == rows
in a batch; the bookkeeping kernel equals the old torch ops on every buffer it writes.
"""

import pytest
import torch

from fp4_compile.codegen.invariant import decode_reference
from fp4_compile.rollout.sampling import gumbel_loglog, gumbel_noise, request_keys
from fp4_compile.testing import assert_bitwise_equal

DEV = "cuda" if torch.cuda.is_available() else "cpu"
TEMPERATURES = [1.0, 0.7, 0.6, 1.3, 2.0]


def _logits(rows, vocab, dtype, seed):
    """Random logits with ties, a NaN row entry and -inf entries (filtered logits)."""
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(rows, vocab, generator=g) * 3).to(dtype)
    x[0, 5] = x[0, 9] = x[0].float().max() + 1  # a tie: the lower id wins
    x[1, : vocab // 2] = float("-inf")
    if rows > 2:
        x[2, 17] = float("nan")
    return x.to(DEV)


def _old_sample(logits, keys, step, temperature):
    """`pick_tokens`' pick before the fusion: argmax(logits.float() / T + gumbel_noise)."""
    noise = gumbel_noise(keys, step, logits.shape[1])
    return torch.argmax(logits.float() / temperature + noise, dim=-1)


@pytest.mark.parametrize(
    ("dtype", "temperature"),
    # every temperature on bf16 logits (the models'); FP32 logits (the load, no cast) at 1 and 0.7
    [(torch.bfloat16, t) for t in TEMPERATURES] + [(torch.float32, 1.0), (torch.float32, 0.7)],
)
def test_sample_argmax_kernel_equals_the_cuda_form_bitwise(temperature, dtype):
    """Contract: the kernel's picks (the noise made in the kernel from the keys and per-row or
    shared draw numbers) == the CUDA form's reference (bytes), with and without the noise
    (greedy), and each row alone == the row in the batch."""
    from fp4_compile.codegen.invariant.sample_argmax_kernel import sample_argmax

    logits = _logits(6, 97, dtype, seed=int(temperature * 10))
    keys = request_keys([3, 1, 4, 1, 5, 9], DEV)
    per_row, shared = torch.arange(6, device=DEV) * 7 + 2, torch.tensor(5, device=DEV)
    for k, step in ((keys, per_row), (keys, shared), (None, None)):
        want = decode_reference.sample_argmax(logits, k, step, temperature, reciprocal=True)
        assert_bitwise_equal(sample_argmax(logits, k, step, temperature), want, "picks")
        for r in range(6):
            row_k = None if k is None else k[r : r + 1]
            row_step = step[r : r + 1] if step is not None and step.dim() else step
            alone = sample_argmax(logits[r : r + 1], row_k, row_step, temperature)
            assert_bitwise_equal(alone, want[r : r + 1], f"row {r} alone")


def test_sample_argmax_kernel_picks_the_old_noise_tensors_pick():
    """Contract: the kernel (noise in registers) == the pick of the old path, which read the
    noise tensor `gumbel_loglog` made (on CUDA: the uniforms kernel and torch's FP64 logs), over
    many draws; and the kernel leaves its per-row scratch reset (every call the same picks)."""
    from fp4_compile.codegen.invariant.sample_argmax_kernel import sample_argmax

    logits = _logits(4, 200, torch.float32, seed=2) * 0.01  # small logits: the noise decides
    keys = request_keys([7, 8, 9, 10], DEV)
    for n in range(6):
        step = torch.full((4,), n, device=DEV)
        noise = (-gumbel_loglog(keys, step, 200)).to(torch.float32)
        want = torch.argmax(decode_reference.scale_logits(logits, 0.9, reciprocal=True) + noise, -1)
        assert_bitwise_equal(sample_argmax(logits, keys, step, 0.9), want, f"picks at draw {n}")
        assert_bitwise_equal(sample_argmax(logits, keys, step, 0.9), want, f"again at draw {n}")


def test_sample_argmax_kernel_ties_nan_and_all_minus_inf():
    """Contract: torch.argmax's order exactly: ties to the lower id across blocks and lanes, the
    first NaN beats +inf, a row of -inf picks id 0."""
    from fp4_compile.codegen.invariant.sample_argmax_kernel import sample_argmax

    x = torch.full((4, 70), float("-inf"))
    x[0, [3, 40, 67]] = 2.0  # tie across lanes and blocks (block_v 32 in the interpreter)
    x[1, [50, 60]] = float("nan")
    x[1, 10] = float("inf")
    x[2, 65] = 1.0
    x = x.to(DEV)
    want = torch.argmax(x, dim=-1)
    assert want.tolist() == [3, 50, 65, 0]
    assert_bitwise_equal(sample_argmax(x, None, None, 1.0), want, "picks")


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_sample_argmax_op_on_cpu_is_the_old_torch_form(temperature):
    """Contract: on CPU the op's picks == the old `pick_tokens` pick (the torch ops it replaced),
    at per-row draw numbers; the greedy form == argmax(logits.float())."""
    logits = _logits(5, 131, torch.bfloat16, seed=4).cpu()
    keys = request_keys([11, 12, 13, 14, 15], "cpu")
    step = torch.tensor([0, 1, 9, 2**31, 5])
    got = torch.ops.fp4_compile.sample_argmax(logits, keys, step, temperature)
    assert_bitwise_equal(got, _old_sample(logits, keys, step, temperature), "sampled picks")
    shared = torch.ops.fp4_compile.sample_argmax(logits, keys, torch.tensor(9), temperature)
    assert_bitwise_equal(shared, _old_sample(logits, keys, 9, temperature), "host draw 9")
    greedy = torch.ops.fp4_compile.sample_argmax(logits, None, None, 1.0)
    assert_bitwise_equal(greedy, torch.argmax(logits.float(), dim=-1), "greedy picks")


def _old_advance(picked, logp, eos, budget, tokens, logps, n, finished, ids, positions, kv_len):
    """`DecodeProgram.record` and `_one_token`'s tail before the fusion (decode_program.py at
    daa3a49), the oracle."""
    live = ~finished
    index = n[:, None]
    tokens.scatter_(1, index, picked[:, None])
    logps.scatter_(1, index, logp[:, None])
    n.add_(live)
    finished |= live & ((picked == eos) | (n >= budget))
    running = ~finished
    ids.copy_(torch.where(running, picked, ids[:, 0])[:, None])
    positions.add_(running[:, None])
    kv_len.add_(running)


def _state(rows, cols, seed):
    g = torch.Generator().manual_seed(seed)
    n = torch.randint(0, cols - 2, (rows,), generator=g)  # budget < cols, as a program's
    state = dict(
        picked=torch.randint(0, 9, (rows,), generator=g),
        logp=-torch.rand(rows, generator=g),
        eos=torch.tensor(7),
        budget=n + torch.randint(1, 3, (rows,), generator=g),
        tokens=torch.randint(0, 9, (rows, cols), generator=g),
        logps=torch.randn(rows, cols, generator=g),
        n=n,
        finished=torch.rand(rows, generator=g) < 0.3,
        ids=torch.randint(0, 9, (rows, 1), generator=g),
        positions=torch.randint(0, 50, (rows, 1), generator=g),
        kv_len=torch.randint(1, 50, (rows,), generator=g),
    )
    return {k: v.to(DEV) for k, v in state.items()}


@pytest.mark.parametrize("rows", [1, 3, 4, 9])
def test_decode_advance_equals_the_old_torch_ops_bitwise(rows):
    """Contract: the bookkeeping kernel and the op (CPU: the reference) write every buffer as the
    old torch ops did, bytes, over several steps (EOS, budgets, finished and live rows; rows
    past one program's block)."""
    from fp4_compile.codegen.invariant.decode_advance_kernel import decode_advance

    for seed in range(4):
        want, kernel, op = (_state(rows, 6, seed) for _ in range(3))
        for _ in range(3):
            _old_advance(**want)
            decode_advance(**kernel)
            torch.ops.fp4_compile.decode_advance(**op)
        for name in want:
            assert_bitwise_equal(kernel[name], want[name], f"kernel {name}")
            assert_bitwise_equal(op[name], want[name], f"op {name}")


def test_ops_pass_opcheck():
    """Contract: schemas, fakes and mutation annotations are right (torch.library.opcheck)."""
    logits = _logits(3, 40, torch.float32, seed=1).cpu()
    keys = request_keys([1, 2, 3], "cpu")
    for step in (torch.tensor(2), torch.tensor([0, 4, 9])):
        torch.library.opcheck(torch.ops.fp4_compile.sample_argmax, (logits, keys, step, 0.7))
    torch.library.opcheck(torch.ops.fp4_compile.sample_argmax, (logits, None, None, 1.0))
    state = {k: v.cpu() for k, v in _state(3, 6, seed=0).items()}
    torch.library.opcheck(torch.ops.fp4_compile.decode_advance, (), state)
