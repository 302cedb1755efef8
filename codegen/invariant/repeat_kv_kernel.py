"""The forward of `fp4_compile::repeat_kv` on CUDA (the interpreter in tests): x [A, 1, C] ->
[A, N, C], each row stored N times from one read, with 16-byte vector accesses. A copy: exact,
bitwise `x.expand(...).contiguous()`, which ATen ran as a scalar elementwise copy of the
stride-0 view (about 50 us per GQA key or value tensor of the learner on the H200, 0.7 TB/s:
`benchmarks/results/2026-12-04_learner_gaps_nographs_8d7d6b8.md`)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..runtime import check_kernel_device, interpreting


@triton.jit
def _repeat_rows_kernel(x_ptr, out_ptr, N, C, BLOCK: tl.constexpr):
    pid = tl.program_id(0)  # one grid axis: rows x column blocks may pass grid-y's 65535
    num_col_blocks = tl.cdiv(C, BLOCK)
    a = (pid // num_col_blocks).to(tl.int64)
    cols = (pid % num_col_blocks) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < C
    row = tl.load(x_ptr + a * C + cols, mask=mask)
    for n in range(N):
        tl.store(out_ptr + (a * N + n) * C + cols, row, mask=mask)


def repeat_rows(x_A1C: torch.Tensor, n: int) -> torch.Tensor:
    """x [A, 1, C] -> [A, n, C] contiguous, every row repeated n times."""
    check_kernel_device(x_A1C, "x")
    if x_A1C.dim() != 3 or x_A1C.shape[1] != 1:
        raise ValueError(f"x must be [A, 1, C], got {tuple(x_A1C.shape)}")
    x = x_A1C.contiguous()
    a, _, c = x.shape
    out = torch.empty((a, n, c), dtype=x.dtype, device=x.device)
    if a and c and n:
        block = 2048
        _repeat_rows_kernel[(a * triton.cdiv(c, block),)](
            x, out, n, c, BLOCK=block, **({} if interpreting() else {"num_warps": 4})
        )
    return out
