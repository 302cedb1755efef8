"""The learner cost model's rules for the backward ops of the GEMMs (`fp4_compile/cost/learner.py`
states them): each composite backward op of an NVFP4 or invariant BF16 GEMM becomes one row per
kernel its CUDA dispatch launches, counted from the op's argument shapes. Shape legend: M
tokens, T routed rows, E experts, N out-features, K in-features.
"""

from __future__ import annotations

import math

import torch
import torch.fx as fx

from ..codegen.nvfp4.gemm_call import decode_recipe
from .rules import OpCost, op_name


def _args(node: fx.Node) -> dict:
    """The op's arguments by schema name."""
    schema = node.target._schema
    out = {}
    for i, a in enumerate(schema.arguments):
        if i < len(node.args):
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        else:
            out[a.name] = a.default_value
    return out


def _shape(x) -> tuple[int, ...]:
    v = x.meta.get("val") if isinstance(x, fx.Node) else None
    return tuple(int(s) for s in v.shape) if isinstance(v, torch.Tensor) else ()


def _size(x) -> int:
    v = x.meta.get("val") if isinstance(x, fx.Node) else None
    return v.element_size() if isinstance(v, torch.Tensor) else 0


def _row(op, node, read, written, flops=0, note="") -> OpCost:
    return OpCost(
        op=op,
        nodes=[node.name],
        launches=1,
        bytes_read=int(read),
        bytes_written=int(written),
        flops=int(flops),
        note=note,
    )


def _recipe(a: dict):
    return decode_recipe(a["recipe"])


def _dense_backward(node: fx.Node) -> list[OpCost]:
    """nvfp4_linear_backward / nvfp4_linear_quantized_backward on CUDA."""
    a = _args(node)
    rec = _recipe(a)
    dy, w = a["grad_out"], a["weight"]
    n, k = _shape(w)
    m = math.prod(_shape(dy)[:-1])
    m16 = -(-m // 16) * 16
    e = _size(dy)  # BF16 (or FP32) activations and gradients; on-grid copies are BF16
    nx, nw = a["needs_x"], a["needs_w"]
    xt = a.get("xt_ongrid")
    xt_given = isinstance(xt, fx.Node) and math.prod(_shape(xt)) > 0
    name = op_name(node)
    rows = []
    per_tensor = rec.grad.global_scale == "per_tensor"
    if nx and nw and per_tensor:
        rows.append(_row(f"{name}: dY amax", node, m * n * e, 4))
    if nx:
        if rec.dgrad == "bf16":
            rows.append(
                _row(f"{name}: dgrad BF16 mm", node, (m * n + n * k) * 2, m * k * e, 2 * m * n * k)
            )
        else:
            rows.append(_row(f"{name}: dY quantize (on-grid)", node, m * n * e, m * n * 2))
            if not isinstance(a["w_ongrid"], fx.Node):
                rows.append(
                    _row(f"{name}: weight dequantize", node, n * k // 2 + n * k // 16, n * k * 2)
                )
            rows.append(
                _row(f"{name}: dgrad GEMM", node, (m * n + n * k) * 2, m * k * e, 2 * m * n * k)
            )
    if nw:
        if rec.wgrad == "bf16":
            rows.append(
                _row(
                    f"{name}: wgrad BF16 mm",
                    node,
                    (m * n + m * k) * 2,
                    n * k * _size(w),
                    2 * m * n * k,
                )
            )
        else:
            rows.append(_row(f"{name}: dY^T quantize", node, m * n * e, n * m16 * 2))
            if not xt_given:
                rows.append(_row(f"{name}: X amax", node, m * k * e, 4))
                rows.append(_row(f"{name}: X^T quantize", node, m * k * e, k * m16 * 2))
            rows.append(
                _row(
                    f"{name}: wgrad GEMM",
                    node,
                    (n + k) * m16 * 2,
                    n * k * _size(w),
                    2 * m16 * n * k,
                )
            )
    if a.get("needs_bias"):
        rows.append(_row(f"{name}: dbias", node, m * n * e, n * 4))
    return rows


def _grouped_backward(node: fx.Node, expert_fraction: float) -> list[OpCost]:
    """nvfp4_grouped_mm_backward on CUDA (T routed rows, E experts)."""
    a = _args(node)
    rec = _recipe(a)
    dy, x, w = a["grad_out"], a["x"], a["weight"]
    experts, n, k = _shape(w)
    t = _shape(dy)[0]
    e = _size(dy)
    name = op_name(node)
    nx, nw = a["needs_x"], a["needs_w"]
    both = nx and nw and rec.dgrad == rec.wgrad == "nvfp4" and rec.grad.global_scale == "per_tensor"
    wbytes = int(experts * n * k * expert_fraction)  # the experts' elements a step touches
    rows = []
    if both:
        rows.append(_row(f"{name}: dY row maxima", node, t * n * e, t * 4))
        rows.append(_row(f"{name}: dY amax", node, t * 4, 4))
    if nx:
        if rec.dgrad == "bf16":
            rows.append(
                _row(
                    f"{name}: dgrad BF16 per expert",
                    node,
                    (t * n + wbytes) * 2,
                    t * k * e,
                    2 * t * n * k,
                )
            )
        else:
            rows.append(_row(f"{name}: dY quantize (on-grid)", node, t * n * e, t * n * 2))
            if not isinstance(a["w_ongrid"], fx.Node):
                rows.append(
                    _row(f"{name}: weight dequantize", node, wbytes // 2 + wbytes // 16, wbytes * 2)
                )
            rows.append(
                _row(
                    f"{name}: dgrad grouped GEMM",
                    node,
                    t * n * 2 + wbytes * 2,
                    t * k * e,
                    2 * t * n * k,
                )
            )
        if isinstance(a.get("x_index"), fx.Node):
            xr = _shape(x)[0]
            rows.append(_row(f"{name}: dX scatter of gathered rows", node, t * k * e, xr * k * e))
    if nw:
        if rec.wgrad == "bf16":
            rows.append(
                _row(
                    f"{name}: wgrad BF16 per expert",
                    node,
                    (t * n + t * k) * 2,
                    experts * n * k * _size(w),
                    2 * t * n * k,
                )
            )
        else:
            t16 = t + 16 * experts  # each expert's segment padded to 16 tokens
            rows.append(_row(f"{name}: segment layout", node, experts * 8, t * 8))
            rows.append(_row(f"{name}: dY segment amax", node, t * 4, experts * 4))
            rows.append(_row(f"{name}: dY^T segments quantize", node, t * n * e, n * t16 * 2))
            rows.append(_row(f"{name}: X row maxima", node, t * k * e, t * 4))
            rows.append(_row(f"{name}: X^T segments quantize", node, t * k * e, k * t16 * 2))
            rows.append(
                _row(
                    f"{name}: wgrad grouped GEMM",
                    node,
                    (n + k) * t16 * 2,
                    experts * n * k * _size(w),
                    2 * t16 * n * k,
                )
            )
    return rows


def _bf16_linear_backward(node: fx.Node, expert_fraction: float) -> list[OpCost]:
    """invariant_linear_backward: the dgrad and the wgrad GEMM (BF16 operands)."""
    a = _args(node)
    dy, x, w = a["grad_y"], a["x"], a["weight"]
    n, k = _shape(w)
    m = math.prod(_shape(dy)[:-1])
    e, name = _size(dy), op_name(node)
    return [
        _row(f"{name}: dgrad", node, (m * n + n * k) * e, m * k * _size(x), 2 * m * n * k),
        _row(f"{name}: wgrad", node, (m * n + m * k) * e, n * k * _size(w), 2 * m * n * k),
    ]


def _bf16_grouped_backward(node: fx.Node, expert_fraction: float) -> list[OpCost]:
    """invariant_grouped_mm_backward: a dgrad and a wgrad GEMM per expert (host loop), FP32."""
    a = _args(node)
    dy, w = a["grad"], a["w_ENK"]
    experts, n, k = _shape(w)
    t, name = _shape(dy)[0], op_name(node)
    wb = int(experts * n * k * expert_fraction) * _size(w)
    rows = [
        _row(f"{name}: dgrad per expert", node, t * n * _size(dy) + wb, t * k * 4, 2 * t * n * k),
        _row(
            f"{name}: wgrad per expert",
            node,
            t * (n + k) * _size(dy),
            experts * n * k * 4,
            2 * t * n * k,
        ),
    ]
    for r in rows:
        r.launches = experts
    return rows


EXPANDED = {
    "fp4_compile.invariant_linear_backward": _bf16_linear_backward,
    "fp4_compile.invariant_grouped_mm_backward": _bf16_grouped_backward,
    "fp4_compile.nvfp4_linear_backward": lambda n, f: _dense_backward(n),
    "fp4_compile.nvfp4_linear_quantized_backward": lambda n, f: _dense_backward(n),
    "fp4_compile.nvfp4_grouped_mm_backward": _grouped_backward,
}


def expand_backward(rows: list[OpCost], gm: fx.GraphModule, expert_fraction: float) -> list[OpCost]:
    """The rows with each composite backward op replaced by its kernels (on CUDA)."""
    by_name = {n.name: n for n in gm.graph.nodes}
    out = []
    for r in rows:
        expand = EXPANDED.get(r.op)
        out.extend(expand(by_name[r.nodes[0]], expert_fraction) if expand else [r])
    return out
