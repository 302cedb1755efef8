"""Triton kernel of `fp4_compile::decode_advance` (one decode token's bookkeeping for every row,
in place), and its launcher.

Shape legend: B rows (slots), T token columns of a row's record.

One lane per row, BLOCK_B rows per program (one program for a decode bucket up to BLOCK_B rows):
the row's record write at its old n, then n, the finished flag and the next step's token,
position and kv length, exactly the order of `decode_reference.decode_advance`. Rows never
interact; every value is an integer or a copied FP32 log-prob, so the results are the torch
ops' bit for bit. The bool flags are read and written as bytes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..runtime import kernel_target


@triton.jit
def _decode_advance_kernel(
    picked_ptr,
    logp_ptr,
    eos_ptr,
    budget_ptr,
    tokens_ptr,
    logps_ptr,
    n_ptr,
    finished_ptr,
    ids_ptr,
    positions_ptr,
    kv_len_ptr,
    B,
    T,
    s_tokens,
    s_logps,
    s_ids,
    s_positions,
    BLOCK_B: tl.constexpr,
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_B + tl.arange(0, BLOCK_B)
    inb = rows < B
    picked = tl.load(picked_ptr + rows, mask=inb, other=0)
    n = tl.load(n_ptr + rows, mask=inb, other=0)
    live = tl.load(finished_ptr + rows, mask=inb, other=1) == 0
    record = inb & (n >= 0) & (n < T)  # a program's budgets keep n < T
    tl.store(tokens_ptr + rows * s_tokens + n, picked, mask=record)
    logp = tl.load(logp_ptr + rows, mask=inb, other=0.0)
    tl.store(logps_ptr + rows * s_logps + n, logp, mask=record)
    n += live.to(tl.int64)
    budget = tl.load(budget_ptr + rows, mask=inb, other=0)
    done = (~live) | ((picked == tl.load(eos_ptr)) | (n >= budget))
    tl.store(n_ptr + rows, n, mask=inb)
    tl.store(finished_ptr + rows, done.to(tl.uint8), mask=inb)
    step = (~done).to(tl.int64)  # the rows still running take their next step
    ids = tl.load(ids_ptr + rows * s_ids, mask=inb, other=0)
    tl.store(ids_ptr + rows * s_ids, tl.where(step != 0, picked, ids), mask=inb)
    position = tl.load(positions_ptr + rows * s_positions, mask=inb, other=0)
    tl.store(positions_ptr + rows * s_positions, position + step, mask=inb)
    kv_len = tl.load(kv_len_ptr + rows, mask=inb, other=0)
    tl.store(kv_len_ptr + rows, kv_len + step, mask=inb)


def decode_advance(
    picked, logp, eos, budget, tokens, logps, n, finished, ids, positions, kv_len
) -> None:
    """`decode_reference.decode_advance` in one launch (arguments checked by the op; the 1-D
    buffers contiguous, as a decode program's are)."""
    target = kernel_target(picked, "picked")
    for name, t in dict(picked=picked, logp=logp, budget=budget, n=n).items():
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if not (finished.is_contiguous() and kv_len.is_contiguous()):
        raise ValueError("finished and kv_len must be contiguous")
    if tokens.stride(1) != 1 or logps.stride(1) != 1:
        raise ValueError("tokens and logps must have unit column stride")
    num = picked.shape[0]
    lc = pick_launch(target.arch, "decode_advance")
    if num:
        _decode_advance_kernel[(triton.cdiv(num, lc["block_b"]),)](
            picked,
            logp,
            eos,
            budget,
            tokens,
            logps,
            n,
            finished.view(torch.uint8),
            ids,
            positions,
            kv_len,
            num,
            tokens.shape[1],
            tokens.stride(0),
            logps.stride(0),
            ids.stride(0),
            positions.stride(0),
            BLOCK_B=lc["block_b"],
            **warps_kwargs(lc),
            **target.options,
        )
