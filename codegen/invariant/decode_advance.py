"""`fp4_compile::decode_advance`: one decode token's bookkeeping for every row of a decode
program, in place (`fp4_compile/rollout/decode_program.py`).

Shape legend: B rows (slots), T token columns of a row's record (max_tokens).

decode_advance(picked [B], logp [B], eos [], budget [B], tokens! [B, T], logps! [B, T], n! [B],
finished! [B], ids! [B, 1], positions! [B, 1], kv_len! [B])   (! = written in place)

    live = ~finished
    tokens[r, n[r]], logps[r, n[r]] = picked[r], logp[r]
    n += live;  finished |= live & (picked == eos | n >= budget)
    running = ~finished:  ids = picked, positions += 1, kv_len += 1   (running rows only)

CPU: `decode_reference.decode_advance` (the torch ops the program ran: 14 launches on CUDA).
CUDA: `decode_advance_kernel`, one launch (each row its own lane; integer and copy work, so the
same values), on the program's static buffers: CUDA-graph safe, no host read. One difference, out
of contract: a record write at n >= T is dropped by the kernel (torch's scatter_ raises; a
program's budgets keep n < T).
"""

from __future__ import annotations

import torch

from . import decode_reference

_WRITTEN = ("tokens", "logps", "n", "finished", "ids", "positions", "kv_len")


def _check(picked, logp, eos, budget, tokens, logps, n, finished, ids, positions, kv_len) -> None:
    num = picked.shape[0]
    ints = dict(picked=picked, eos=eos, budget=budget, tokens=tokens, n=n, ids=ids)
    ints.update(positions=positions, kv_len=kv_len)
    for name, t in ints.items():
        if t.dtype != torch.int64:
            raise TypeError(f"{name} must be int64, got {t.dtype}")
    if logp.dtype != torch.float32 or logps.dtype != torch.float32:
        raise TypeError(f"logp and logps must be float32, got {logp.dtype}, {logps.dtype}")
    if finished.dtype != torch.bool:
        raise TypeError(f"finished must be bool, got {finished.dtype}")
    shapes = dict(picked=(num,), logp=(num,), eos=(), budget=(num,), n=(num,), finished=(num,))
    shapes.update(ids=(num, 1), positions=(num, 1), kv_len=(num,))
    shapes.update(tokens=(num, tokens.shape[-1]), logps=(num, tokens.shape[-1]))
    got = dict(picked=picked, logp=logp, eos=eos, budget=budget, n=n, finished=finished, ids=ids)
    got.update(positions=positions, kv_len=kv_len, tokens=tokens, logps=logps)
    for name, want in shapes.items():
        if tuple(got[name].shape) != want:
            raise ValueError(f"{name} must be {list(want)}, got {list(got[name].shape)}")


@torch.library.custom_op("fp4_compile::decode_advance", mutates_args=_WRITTEN)
def decode_advance(
    picked: torch.Tensor,
    logp: torch.Tensor,
    eos: torch.Tensor,
    budget: torch.Tensor,
    tokens: torch.Tensor,
    logps: torch.Tensor,
    n: torch.Tensor,
    finished: torch.Tensor,
    ids: torch.Tensor,
    positions: torch.Tensor,
    kv_len: torch.Tensor,
) -> None:
    args = (picked, logp, eos, budget, tokens, logps, n, finished, ids, positions, kv_len)
    _check(*args)
    if picked.is_cuda:
        from .decode_advance_kernel import decode_advance as launch  # lazy: imports triton

        launch(*args)
    else:
        decode_reference.decode_advance(*args)


@decode_advance.register_fake
def _(picked, logp, eos, budget, tokens, logps, n, finished, ids, positions, kv_len):
    _check(picked, logp, eos, budget, tokens, logps, n, finished, ids, positions, kv_len)
