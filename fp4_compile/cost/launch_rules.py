"""The CUDA launches of each `fp4_compile` op at its argument shapes, as its dispatch makes them
on sm_90 (H100 / H200), with the programs (CTAs) of each launch's grid where the launcher's grid
formula and the pinned configs (`codegen/configs.py`, `codegen/launch_table.py`) give it.

`op_launches(node)` -> [Launch]; read by `launches.py` (the launch count of a decode step). Each
entry below cites the dispatch it follows; a launch whose grid is ATen's own (embedding, cos,
a `torch.ones` fill) has `programs=None` (unknown here). Shape legend: M rows (tokens), K
in-features, N out-features, E experts, H hidden, C a SwiGLU half, B sequences, Hkv KV heads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from ..codegen.configs import DECODE, LAUNCH, pick
from ..codegen.nvfp4.gemm import ONGRID_FORWARD_MIN_ROWS
from ..codegen.nvfp4.norm_parts import codes_deferred
from ..codegen.nvfp4.silu_mul_parts import PART_COLUMNS
from ..codegen.runtime import row_blocks

ARCH = "sm_90"
NUM_SMS = 132  # H100 SXM; the brief's one-program-per-SM line (the H200 also has 132)


@dataclass(frozen=True)
class Launch:
    kernel: str
    programs: int | None  # None: ATen's own grid, not modeled


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _val(x) -> torch.Tensor | None:
    v = x.meta.get("val") if isinstance(x, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _arg(n: fx.Node, i: int, name: str, default):
    """Op node `n`'s argument `name` (position i, else a keyword, else its default)."""
    return n.args[i] if len(n.args) > i else n.kwargs.get(name, default)


def _rows(t: torch.Tensor) -> int:
    return int(t.numel()) // int(t.shape[-1]) if t.dim() else 1


def _norm_rows_per_program(hdim: int) -> int:
    """`invariant/rms_norm_kernel.rms_norm_launch`: rows per program for a row of H."""
    lc = LAUNCH[("any", "rms_norm")]
    block = 1 << (hdim - 1).bit_length()
    return max(1, min(lc["max_rows"], lc["row_elements"] // block))


def _row_codes(m: int, k: int) -> Launch:
    """`nvfp4/row_codes_kernel.row_codes_from_parts`: grid (cdiv(M, block_r), cdiv(K, block_k))."""
    lc = LAUNCH[("cuda", "row_codes")]
    return Launch("row_codes", _cdiv(m, lc["block_r"]) * _cdiv(k, lc["block_k"]))


def act_quantize(m: int, k: int) -> list[Launch]:
    """`nvfp4/quantize_kernel.quantize_triton(x, "1x16", "per_row", out="ongrid")`: below
    row_quantize's split_rows_below, chunk maxima then row codes; else the per-row global
    stage then the codes kernel (`_global_scales`, `launch_rows`)."""
    if m < LAUNCH[("cuda", "row_quantize")]["split_rows_below"]:
        lc = LAUNCH[("cuda", "chunk_abs_max")]
        parts = _cdiv(m, lc["block_r"]) * _cdiv(k, lc["block_k"])
        return [Launch("chunk_abs_max", parts), _row_codes(m, k)]
    cfg = pick(ARCH, "any", "nvfp4_quantize", m)
    global_rows = _cdiv(m, LAUNCH[("cuda", "row_abs_max")]["block_r"])
    return [
        Launch("row_global", global_rows),
        Launch("quantize_codes", _cdiv(m, cfg.block_m) * _cdiv(k, cfg.block_k)),
    ]


def nvfp4_gemm(m: int, n: int, k: int, experts: int = 0) -> list[Launch]:
    """`nvfp4/gemm_kernel.launch_gemm` with packed B (the weight store's codes): rows per weight
    (per expert: ceil(M / E)) within `configs.DECODE`'s buckets run the decode kernel, grid
    (t_tiles * cdiv(N, block_w), splits) with splits 1 (sm_90 pins K_CHUNK 0: one chain); more
    rows the pinned GEMM tile, grid (cdiv(M, block_m) [+ E]) * cdiv(N, block_n); from
    ONGRID_FORWARD_MIN_ROWS rows the weight is dequantized first (`gemm_cuda.cuda_linear`)."""
    rows = max(1, _cdiv(m, experts)) if experts else m
    extra = experts if experts else 0
    for max_m, cfg in DECODE[ARCH]:
        if rows <= max_m:
            tiles = (_cdiv(m, cfg.block_t) + extra) * _cdiv(n, cfg.block_w)
            return [Launch("nvfp4_decode_gemm", tiles)]
    out = []
    op = "nvfp4_gemm"
    if rows >= ONGRID_FORWARD_MIN_ROWS:
        lc = LAUNCH[("cuda", "ongrid_weight")]
        weight_rows = n * max(1, experts)
        out.append(
            Launch("ongrid_weight", _cdiv(weight_rows, lc["block_r"]) * _cdiv(k, lc["block_k"]))
        )
        op = "nvfp4_gemm_ongrid"
    cfg = pick(ARCH, "bf16", op, rows, n=None if experts else n)
    out.append(Launch("nvfp4_gemm", (_cdiv(m, cfg.block_m) + extra) * _cdiv(n, cfg.block_n)))
    return out


def _quantizing_decode(quant: list[Launch], gemm: list[Launch]) -> list[Launch]:
    """A GEMM op's own quantize and GEMM launches: where the quantize takes the split form
    (chunk maxima, row codes) and the GEMM the decode kernel, the decode kernel quantizes A in
    its prologue and no row_codes runs (`nvfp4/gemm_cuda.few_row_parts`)."""
    split = [q.kernel for q in quant] == ["chunk_abs_max", "row_codes"]
    if split and [g.kernel for g in gemm] == ["nvfp4_decode_gemm"]:
        return [quant[0], *gemm]
    return quant + gemm


def _fused_quantize(name: str, m: int, c: int, split_key: str) -> list[Launch]:
    """rms_norm_quantize / silu_mul_quantize: one launch, or below split_rows_below the split
    form's two (`nvfp4/rms_norm_quantize_kernel.py`, `nvfp4/silu_mul_quantize_kernel.py`)."""
    lc = LAUNCH[("cuda", split_key)]
    if name in ("rms_norm_quantize", "add_rms_norm_quantize"):  # the residual form: the same
        first = Launch("rms_norm_amax", _cdiv(m, _norm_rows_per_program(c)))
        whole = Launch("rms_norm_quantize", first.programs)
    else:
        first = Launch(
            "silu_mul_parts", _cdiv(m, lc["split_block_r"]) * _cdiv(c, lc["split_block_c"])
        )
        whole = Launch("silu_mul_quantize", _cdiv(m, lc["block_r"]))
    return [first, _row_codes(m, c)] if m < lc["split_rows_below"] else [whole]


def _mask_args(mask: torch.Tensor, tq: int) -> list[Launch]:
    """`invariant/attention_masks.prepare_mask`: a torch.ones flag, then one program per mask
    row (mb * mh * Tq, mb and mh the mask's batch and head extents)."""
    shape = (1,) * (4 - mask.dim()) + tuple(int(s) for s in mask.shape)
    return [Launch("ones (mask flag)", 1), Launch("attention_mask_args", shape[0] * shape[1] * tq)]


def _expert_order(slots: int, experts: int) -> list[Launch]:
    """`moe/expert_order`: one program within the launch table's limits, else the torch ops."""
    lc = LAUNCH[("cuda", "expert_order")]
    if slots <= lc["max_slots"] and experts <= lc["max_experts"]:
        return [Launch("expert_order", 1)]
    # `reference.expert_order_reference`'s kernels (empty_like allocates, views are free)
    torch_ops = ("sort", "arange", "searchsorted", "index_put_", "div", "_to_copy", "index")
    return [Launch(f"expert_order: {op}", None) for op in torch_ops]


def op_launches(n: fx.Node) -> list[Launch]:
    """The CUDA launches of fp4_compile op node `n` (its args' `meta["val"]` give the shapes)."""
    name = n.target._opname
    args = [_val(a) for a in n.args]
    out = _val(n) if _val(n) is not None else (n.meta.get("val") or [None])[0]
    if name in ("nvfp4_linear", "nvfp4_linear_quantized"):  # x [.., K], w_codes [N, K/2]
        # N from the codes: a fused group's GEMM (`passes/fuse_group_gemms.py`) reads the
        # group's buffer [N_total, K/2] and names its first member's weight
        x, codes = args[0], args[2]
        m, k, nn = _rows(x), int(x.shape[-1]), int(codes.shape[-2])
        quant = act_quantize(m, k) if name == "nvfp4_linear" else []  # gemm_cuda.cuda_linear
        return _quantizing_decode(quant, nvfp4_gemm(m, nn, k))
    if name in ("nvfp4_grouped_mm", "nvfp4_grouped_mm_quantized"):  # w [E, N, K]
        x, w = args[0], args[1]
        m, k = int(out.shape[0]), int(x.shape[-1])
        quant = act_quantize(_rows(x), k) if name == "nvfp4_grouped_mm" else []
        return _quantizing_decode(quant, nvfp4_gemm(m, int(w.shape[1]), k, experts=int(w.shape[0])))
    if name == "nvfp4_linear_parts":  # nvfp4/norm_parts._kernel_linear: x [.., K], codes [N, K/2]
        x, codes, w_ongrid = args[0], args[4], args[7]
        m, k = _rows(x), int(x.shape[-1])
        gemm = nvfp4_gemm(m, int(codes.shape[-2]), k)
        if not codes_deferred(ARCH, m) or (w_ongrid is None and m < ONGRID_FORWARD_MIN_ROWS):
            return gemm  # the codes' GEMM, or the decode GEMM quantizing in its prologue
        return [_row_codes(m, k), *gemm]
    if name == "nvfp4_grouped_mm_parts":  # nvfp4/grouped_parts._kernel_grouped: w [E, N, K/2]
        x, codes, w_ongrid = args[0], args[4], args[7]
        m_x, k, e = _rows(x), int(x.shape[-1]), int(codes.shape[0])
        gemm = nvfp4_gemm(int(out.shape[0]), int(codes.shape[1]), k, experts=e)
        rows = max(1, _cdiv(int(out.shape[0]), e))
        if not codes_deferred(ARCH, m_x, _arg(n, 10, "groups", 1)):
            return gemm  # the codes' GEMM
        if w_ongrid is None and rows < ONGRID_FORWARD_MIN_ROWS and codes_deferred(ARCH, rows):
            return gemm  # the decode GEMM quantizing its gathered rows in its prologue
        return [_row_codes(m_x, k), *gemm]
    if name == "rms_norm_quantize_parts":  # nvfp4/norm_parts: the norm's first launch alone
        x, hdim = args[0], int(args[0].shape[-1])
        if codes_deferred(ARCH, _rows(x)):
            return [Launch("rms_norm_amax", _cdiv(_rows(x), _norm_rows_per_program(hdim)))]
        return _fused_quantize("rms_norm_quantize", _rows(x), hdim, "rms_norm_quantize")
    if name == "silu_mul_quantize_parts":  # nvfp4/silu_mul_parts: the split form's first launch
        m, c = _rows(args[0]), int(args[0].shape[-1])
        if codes_deferred(ARCH, m, _arg(n, 4, "groups", 1)):
            lc = LAUNCH[("cuda", "silu_mul_quantize")]
            tiles = _cdiv(m, lc["split_block_r"]) * _cdiv(c, PART_COLUMNS)
            return [Launch("silu_mul_parts", tiles)]
        return _fused_quantize("silu_mul_quantize", m, c, "silu_mul_quantize")
    if name in ("rms_norm_quantize", "add_rms_norm_quantize"):  # x [.., H] (+ residual)
        x = args[0]
        return _fused_quantize(name, _rows(x), int(x.shape[-1]), "rms_norm_quantize")
    if name in ("silu_mul_quantize", "silu_mul_halves_quantize"):
        x = args[0]
        c = int(x.shape[-1]) // (2 if name == "silu_mul_halves_quantize" else 1)
        return _fused_quantize(name, _rows(x), c, "silu_mul_quantize")
    if name in ("silu_mul", "silu_mul_halves"):  # invariant/silu_mul_kernel._launch
        x = args[0]
        c = int(x.shape[-1]) // (2 if name == "silu_mul_halves" else 1)
        lc = LAUNCH[("any", "silu_mul")]
        return [Launch(name, _cdiv(_rows(x), lc["block_r"]) * _cdiv(c, lc["block_c"]))]
    if name in ("invariant_rms_norm", "invariant_add_rms_norm"):  # rms_norm_kernel.rms_norm
        x = args[0]
        norm = Launch(name, _cdiv(_rows(x), _norm_rows_per_program(int(x.shape[-1]))))
        # rms_norm's x.reshape(-1, H).contiguous(): one copy where x's rows are neither one
        # block nor blocks it reads in place (`runtime.row_blocks`: a fused q/k/v GEMM's q or k)
        copy = not x.is_contiguous() and row_blocks(x) is None
        return ([Launch("copy (rms_norm input)", None)] if copy else []) + [norm]
    if name == "moe_combine_add_rms_norm":  # moe/combine_add_rms_norm_kernel: the norm's grid
        r = args[0]
        return [Launch(name, _cdiv(_rows(r), _norm_rows_per_program(int(r.shape[-1]))))]
    if name == "moe_combine_add_rms_norm_parts":  # moe/combine_add_rms_norm_parts: at a decode
        # one launch (the norm's grid), else moe_combine then rms_norm_quantize_parts
        r, hdim = args[0], int(args[0].shape[-1])
        if codes_deferred(ARCH, _rows(r)):
            return [Launch(name, _cdiv(_rows(r), _norm_rows_per_program(hdim)))]
        lc = LAUNCH[("cuda", "moe_combine")]
        combine = Launch("moe_combine", _cdiv(_rows(r), lc["block_t"]) * _cdiv(hdim, lc["block_h"]))
        return [combine, *_fused_quantize("rms_norm_quantize", _rows(r), hdim, "rms_norm_quantize")]
    if name in ("invariant_rms_norm_pair", "invariant_rms_norm_pair_rotary"):
        # rms_norm_kernel.rms_norm_pair / rms_norm_rotary_kernel.rms_norm_pair_rotary: a's
        # programs, then b's
        a, b = args[0], args[2]
        rows = _norm_rows_per_program(int(a.shape[-1]))
        norm = Launch(name, _cdiv(_rows(a), rows) + _cdiv(_rows(b), rows))
        # a copy for an input whose rows are neither one block nor blocks read in place
        copies = [t for t in (a, b) if not t.is_contiguous() and row_blocks(t) is None]
        return [Launch("copy (rms_norm input)", None) for _ in copies] + [norm]
    if name == "invariant_linear":  # invariant/linear_kernel.linear
        x, w = args[0], args[1]
        cfg = pick(ARCH, "any", "invariant_linear", _rows(x))
        return [Launch(name, _cdiv(_rows(x), cfg.block_m) * _cdiv(int(w.shape[0]), cfg.block_n))]
    if name == "invariant_grouped_mm":  # moe/grouped_mm.grouped_kernel: the GEMM (unit scales
        # made once per device; x_index: A's rows gathered in the operand load)
        w, rows = args[1], int(out.shape[0])
        e, nn = int(w.shape[0]), int(w.shape[1])
        cfg = pick(ARCH, "bf16", "nvfp4_gemm_ongrid", 1)  # rows_per_group=1
        tiles = (_cdiv(rows, cfg.block_m) + e) * _cdiv(nn, cfg.block_n)
        return [Launch("grouped_gemm", tiles)]
    if name == "invariant_attention":  # invariant/attention_kernel.attention
        q, k = args[0], args[1]
        b, hq, tq, _ = (int(s) for s in q.shape)
        hkv = int(k.shape[1])
        cfg = pick(ARCH, "any", "invariant_attention", 0)
        main = Launch(name, _cdiv(tq * (hq // hkv), cfg.block_m) * b * hkv)
        mask = args[5] if len(args) > 5 else None
        prepared = len(args) > 8 and args[8] is not None  # invariant_attention_mask_args' words
        if mask is None or prepared:
            return [main]
        return _mask_args(mask, tq) + [main]  # attention_masks.mask_args inside the call
    if name == "invariant_attention_parts":  # the same launch, the maxima in its epilogue
        q, k = args[0], args[1]
        b, hq, tq, _ = (int(s) for s in q.shape)
        cfg = pick(ARCH, "any", "invariant_attention", 0)
        main = Launch(name, _cdiv(tq * (hq // int(k.shape[1])), cfg.block_m) * b * int(k.shape[1]))
        prepared = len(args) > 8 and args[8] is not None
        return [main] if args[5] is None or prepared else _mask_args(args[5], tq) + [main]
    if name == "nvfp4_linear_with_parts":  # gemm_cuda.cuda_linear with the given maxima
        x, codes = args[0], args[2]
        m, k = _rows(x), int(x.shape[-1])
        quant = _quantizing_decode(act_quantize(m, k), nvfp4_gemm(m, int(codes.shape[-2]), k))
        return quant[1:] if quant[0].kernel == "chunk_abs_max" else quant
    if name == "invariant_attention_mask_args":  # invariant/attention_masks.prepare_mask
        return _mask_args(args[0], int(n.args[1]))
    if name == "rotary_tables":  # invariant/rotary_tables_kernel: a program per position
        return [Launch(name, int(args[0].numel()))]
    if name == "invariant_position_mask":  # invariant/position_mask_kernel: a program per row
        return [Launch(name, _rows(args[0]) * int(args[0].shape[-1]))]
    if name in ("invariant_routing", "invariant_logprobs"):  # one program per row
        return [Launch(name, _rows(args[0]))]
    if name == "sample_argmax":  # invariant/sample_argmax_kernel: (rows, cdiv(V, chunk_v))
        chunks = _cdiv(int(args[0].shape[-1]), LAUNCH[("cuda", name)]["chunk_v"])
        return [Launch(name, _rows(args[0]) * chunks)]
    if name == "decode_advance":  # invariant/decode_advance_kernel: block_b rows per program
        return [Launch(name, _cdiv(int(args[0].shape[0]), LAUNCH[("cuda", name)]["block_b"]))]
    if name == "kv_cache_write":  # invariant/kv_cache_write_kernel: one program per (b, h, t)
        k = args[3]
        return [Launch(name, int(k.shape[0]) * int(k.shape[1]) * int(k.shape[2]))]
    if name == "moe_combine":  # moe/combine_kernel: (cdiv(T, block_t), cdiv(H, block_h))
        lc = LAUNCH[("cuda", "moe_combine")]
        t, h = int(out.shape[0]), int(out.shape[-1])
        return [Launch(name, _cdiv(t, lc["block_t"]) * _cdiv(h, lc["block_h"]))]
    if name == "expert_order":  # moe/expert_order: one program, or past its limits the torch ops
        return _expert_order(_rows(args[0]) * int(args[0].shape[-1]), int(n.args[2]))
    if name == "routing_order":  # moe/routing_order: one program, or past expert_order's limits
        t, e, k = _rows(args[0]), int(args[0].shape[-1]), int(n.args[1])  # the two ops
        if _expert_order(t * k, e) == [Launch("expert_order", 1)]:
            return [Launch(name, 1)]
        return [Launch("invariant_routing", t)] + _expert_order(t * k, e)
    if name in ("embedding", "gather_rows", "cos", "sin"):  # one ATen kernel each
        return [Launch(name, None)]
    raise NotImplementedError(
        f"fp4_compile::{name}: no CUDA launch rule (add one to fp4_compile/cost/launch_rules.py)"
    )
