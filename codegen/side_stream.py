"""A second CUDA stream for one branch of an op's work, joined before the op returns.

A GEMM backward has two independent branches: dgrad (quantize dY, then dX = q(dY) q(W)) and
wgrad (quantize dY^T and X^T, then dW = q(dY^T) q(X^T)^T). Issued on one stream, each kernel
waits for the one before; the quantize kernels are bound by integer ALU work and memory, the
GEMMs by the tensor cores, so one branch's quantize can run beside the other's GEMM. The op
forks the wgrad branch onto the side stream and joins it before it returns: the same kernels on
the same inputs (the bits do not change), in a different overlap.

Under CUDA graph capture the fork and the join are captured as graph edges (the side stream
joins the capture by waiting on the capturing stream), so replays overlap the same way.
Tensors a branch returns must be allocated on the main stream before the fork (the caching
allocator reuses a block only on the stream it was allocated on); the side branch's own
temporaries live and die on the side stream. Off with MINITE_SIDE_STREAM=0 (one stream, the
order of issue as before)."""

from __future__ import annotations

import os

import torch

_STREAMS: dict[int, torch.cuda.Stream] = {}


def enabled(device: torch.device) -> bool:
    return device.type == "cuda" and os.environ.get("MINITE_SIDE_STREAM", "1") != "0"


def _side(device: torch.device) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _STREAMS:
        _STREAMS[index] = torch.cuda.Stream(device=index)
    return _STREAMS[index]


class SideBranch:
    """`with branch:` issues the block's kernels on the side stream, forked from the current
    stream when the branch is made; the main stream goes on after the block; `join()` makes the
    main stream wait for the side branch (call it before the op returns, also on errors).
    Off CUDA or when disabled, everything runs on the current stream and join does nothing."""

    def __init__(self, device: torch.device):
        self.on = enabled(device)
        self._ctx = None
        if self.on:
            self.main = torch.cuda.current_stream(device)
            self.side = _side(device)
            self.side.wait_stream(self.main)

    def __enter__(self) -> SideBranch:
        if self.on:
            self._ctx = torch.cuda.stream(self.side)
            self._ctx.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
            self._ctx = None

    def join(self) -> None:
        if self.on:
            self.main.wait_stream(self.side)
