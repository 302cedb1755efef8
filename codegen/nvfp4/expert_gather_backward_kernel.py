"""The gradient of the experts' input x [T, C] from that of its gathered rows x[x_index] [S, C]
(S = T * k slots sorted by expert), when the gather index is a sort permutation's
`perm // k`: transformers' experts gather `hidden_states[perm // top_k]`.

Shape legend: T rows of x (tokens), S = T * k gathered rows (slots), C the columns; perm,
x_index and inv are [S].

`gather_rows`' backward sums each row's positions in ascending position order, and finds them
with a stable sort of the index (`row_segments`: a radix sort, two searchsorted, ~13 small
kernels per call). Here the positions of token t are known without sorting: they are
inv[t * k + j], j < k, with inv the inverse of perm (one scatter pass). Program (token block,
column block) orders each token's k candidates ascending (k steps of a row minimum), then adds
the rows of those whose index IS t (x_index[q] == t: a masked slot, index -1, adds nothing),
one FP32 add per step from +0.0, and rounds once to grad's dtype: the same sums in the same
order as `gather_rows_backward(where(x_index >= 0, x_index, T), ...)`, bitwise.

Precondition (proven by the pass that attaches perm, `passes/fold_expert_gathers.py`; checked
in full on the CPU): x_index[q] >= 0 implies x_index[q] == perm[q] // k."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..configs import pick_launch, warps_kwargs
from ..invariant.gather_rows_kernel import store_row_sums
from ..runtime import arch_of, check_kernel_device, compile_options


@triton.jit
def _inverse_permutation_kernel(perm_ptr, inv_ptr, S, BLOCK: tl.constexpr):
    q = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = q < S
    p = tl.load(perm_ptr + q, mask=live, other=0)
    tl.store(inv_ptr + p, q.to(inv_ptr.dtype.element_ty), mask=live)


@triton.jit
def _slot_rows_sum_kernel(
    g_ptr,
    inv_ptr,
    xi_ptr,
    out_ptr,
    T,
    C,
    S,
    TOP_K: tl.constexpr,
    K_P2: tl.constexpr,
    BF16: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_C: tl.constexpr,
):
    pid = tl.program_id(0).to(tl.int64)
    num_col_blocks = tl.cdiv(C, BLOCK_C)
    tok = (pid // num_col_blocks) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = (pid % num_col_blocks) * BLOCK_C + tl.arange(0, BLOCK_C)
    tlive = tok < T
    cmask = cols < C
    j = tl.arange(0, K_P2)
    slots = tok.to(tl.int64)[:, None] * TOP_K + j[None, :]
    cand = tl.load(inv_ptr + slots, mask=tlive[:, None] & (j < TOP_K)[None, :], other=S)
    cand = cand.to(tl.int64)
    acc = tl.zeros((BLOCK_T, BLOCK_C), tl.float32)
    for _ in tl.static_range(TOP_K):  # the candidates in ascending order (all distinct)
        q = tl.min(cand, axis=1)
        cand = tl.where(cand == q[:, None], S, cand)
        real = q < S
        xi = tl.load(xi_ptr + q, mask=real, other=-1)
        take = real & (xi == tok)
        m = take[:, None] & cmask[None, :]
        g = tl.load(g_ptr + q[:, None] * C + cols[None, :], mask=m, other=0.0).to(tl.float32)
        acc = tl.where(take[:, None], acc + g, acc)
    store_row_sums(out_ptr, acc, tok, cols, tlive, cmask, C, BF16)


def check_perm_precondition(
    x_index: torch.Tensor, perm: torch.Tensor, rows: int, *, data: bool = True
) -> int:
    """k = S / rows, after checking (CPU with `data`: in full; CUDA or fake tensors: shapes and
    dtypes, a full check would synchronize) that perm is a permutation of 0..S-1 and
    x_index[q] >= 0 implies x_index[q] == perm[q] // k."""
    s = x_index.shape[0]
    if perm.dim() != 1 or perm.shape[0] != s or perm.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"x_perm must be int32/int64 [S={s}], got {perm.dtype} {tuple(perm.shape)}"
        )
    if rows < 1 or s % rows:
        raise ValueError(f"x_perm needs S={s} to be a multiple of x's rows ({rows})")
    k = s // rows
    if data and perm.device.type == "cpu" and s:
        is_perm = torch.equal(torch.sort(perm).values, torch.arange(s, dtype=perm.dtype))
        used = x_index >= 0
        if not is_perm or not torch.equal(x_index[used], (perm[used] // k).to(x_index.dtype)):
            raise ValueError(
                "x_perm must be a permutation with x_index[q] == x_perm[q] // k "
                "wherever x_index[q] >= 0"
            )
    return k


def expert_gather_backward_triton(
    grad: torch.Tensor, x_index: torch.Tensor, perm: torch.Tensor, rows: int
) -> torch.Tensor:
    """[rows, C] in grad's dtype (bfloat16 / float32): the position-ordered FP32 sums of grad's
    rows q with x_index[q] == t, for each row t (see the module docstring)."""
    check_kernel_device(grad, "grad")
    if grad.dtype not in (torch.bfloat16, torch.float32):
        raise TypeError(f"grad must be bfloat16 or float32, got {grad.dtype}")
    s = x_index.shape[0]
    if grad.dim() != 2 or grad.shape[0] != s:
        raise ValueError(f"grad must be [S={s}, C], got {tuple(grad.shape)}")
    k = check_perm_precondition(x_index, perm, rows)
    g2 = grad.contiguous()
    c = g2.shape[1]
    inv = torch.empty_like(perm)
    out = torch.empty((rows, c), dtype=grad.dtype, device=grad.device)
    lc = pick_launch(arch_of(grad.device), "expert_gather_backward")
    opts = warps_kwargs(lc)
    if s:
        _inverse_permutation_kernel[(triton.cdiv(s, lc["block_s"]),)](
            perm.contiguous(), inv, s, BLOCK=lc["block_s"], **opts, **compile_options(grad.device)
        )
    if rows and c:
        grid = (triton.cdiv(rows, lc["block_t"]) * triton.cdiv(c, lc["block_c"]),)
        _slot_rows_sum_kernel[grid](
            g2,
            inv,
            x_index.contiguous(),
            out,
            rows,
            c,
            s,
            TOP_K=k,
            K_P2=triton.next_power_of_2(k),
            BF16=grad.dtype == torch.bfloat16,
            BLOCK_T=lc["block_t"],
            BLOCK_C=lc["block_c"],
            **opts,
            **compile_options(grad.device),
        )
    return out
