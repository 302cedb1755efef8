"""The counting rules of the step cost model: one lowered (or stock) ATen graph of the rollout
step -> one `OpCost` row per kernel the step launches. The rules are written out in
`fp4_compile/cost/rollout.py`'s docstring (the one place). Shape legend: B sequences, Tq new tokens
per sequence, S static cache slots, L filled keys per sequence, E experts, k experts per token.
"""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass, field

import torch
import torch.fx as fx

from ..codegen.nvfp4.gemm import ONGRID_FORWARD_MIN_ROWS
from ..codegen.nvfp4.gemm_call import GemmCall

# H200 device copy, read + write: `benchmarks/results/2026-12-05_decode_gemm_20848a7.md`
# ("Device copy: 4254 GB/s (read + write)").
COPY_BYTES_PER_S = 4254e9
# cuBLAS BF16 8192^3 on the H200: `benchmarks/results/2026-12-02_gemm.md` (678 TFLOP/s).
BF16_FLOPS_PER_S = 678e12

_VIEWS = {
    "view",
    "_unsafe_view",
    "reshape",
    "transpose",
    "permute",
    "t",
    "unsqueeze",
    "squeeze",
    "expand",
    "slice",
    "select",
    "alias",
    "detach",
    "as_strided",
    "chunk",
    "split",
    "split_with_sizes",
    "unbind",
    "_assert_tensor_metadata",
    "sym_size",
    "sym_numel",
    "sym_stride",
    "lift_fresh_copy",
    "unflatten",
    "flatten",
    "narrow",
}
# ops that launch no kernel (views and metadata), for the launch count (`launches.py`)
VIEW_OPS = frozenset(_VIEWS)
_GEMMS = {"mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "_grouped_mm"}
_ATTENTION = {
    "scaled_dot_product_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
}
EXTERN = (
    _GEMMS
    | _ATTENTION
    | {
        "sort",
        "topk",
        "cumsum",
        "cumprod",
        "histc",
        "bincount",
        "argsort",
        "scatter",
        "scatter_",
        "scatter_add",
        "scatter_add_",
        "index_put",
        "index_put_",
        "index_add",
        "index_add_",
        "nonzero",
        "searchsorted",
        "multinomial",
        "index_copy_",
        "index_copy",
    }
)
_IN_PLACE = {"scatter_", "index_put_", "index_copy_", "index_add_", "scatter_add_"}
_WEIGHT_CACHED = {"quantize", "quantize_with_ongrid", "weight_group_amax"}
# fp4_compile ops whose CUDA dispatch launches more than one kernel: x quantized inside the op
EXTRA_LAUNCHES = {"nvfp4_linear": 1, "nvfp4_grouped_mm": 1}
_NVFP4_GEMMS = {
    "nvfp4_linear",
    "nvfp4_linear_quantized",
    "nvfp4_grouped_mm",
    "nvfp4_grouped_mm_quantized",
}
_BF16_GEMMS = {"invariant_linear", "invariant_grouped_mm"}
_GROUPED = {"nvfp4_grouped_mm", "nvfp4_grouped_mm_quantized", "invariant_grouped_mm", "_grouped_mm"}


_COPY = "copies the whole static cache (S slots) per query head"
# experts' weights [E, N, K] (16x16, one global scale per expert) quantize in two steps on sm_90
# (`quantize_kernel.quantize_triton`; one read was slower: `weight_quantize_kernel.py`): the row
# maxima (read W, write [E, N] FP32), then the codes (read W again)
EXPERT_ROW_MAXIMA = "two steps: row maxima (a read of W), then the codes"


def per_expert_quantize(global_scale) -> bool:
    """Whether a quantize with this global_scale argument is an experts' weight quantize (one
    global scale per expert, from the row maxima)."""
    return global_scale == "per_expert"


@dataclass
class OpCost:
    op: str
    nodes: list[str]
    launches: int
    bytes_read: int
    bytes_written: int
    flops: int
    kv_cache: str = ""
    copies_kv_cache: bool = False
    note: str = ""
    roofline_us: float = field(default=0.0)

    def __post_init__(self) -> None:
        moved = (self.bytes_read + self.bytes_written) / COPY_BYTES_PER_S
        self.roofline_us = 1e6 * max(moved, self.flops / BF16_FLOPS_PER_S)

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    def to_dict(self) -> dict:
        return {**asdict(self), "bytes": self.bytes}


def op_name(node: fx.Node) -> str:
    """The op as namespace.name without overload: fp4_compile.repeat_kv, aten.mm."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._opname}"
    return getattr(target, "__name__", str(target))


def _short(node: fx.Node) -> str:
    return op_name(node).split(".", 1)[-1]


def _val(node) -> torch.Tensor | None:
    v = node.meta.get("val") if isinstance(node, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else int(t.numel()) * t.element_size()


def _outputs(node: fx.Node) -> list[torch.Tensor]:
    v = node.meta.get("val")
    items = v if isinstance(v, (tuple, list)) else [v]
    return [t for t in items if isinstance(t, torch.Tensor)]


def _tensor_args(node: fx.Node) -> list[tuple[int, fx.Node]]:
    out = []
    for i, a in enumerate([*node.args, *node.kwargs.values()]):
        for x in a if isinstance(a, (list, tuple)) else [a]:
            if isinstance(x, fx.Node) and _val(x) is not None:
                out.append((i, x))
    return out


class _Graph:
    """Per-node facts: view or not, its storage base, parameter / cache lineage."""

    def __init__(self, gm: fx.GraphModule, params: set[str], caches: set[str]):
        self.nodes = [n for n in gm.graph.nodes]
        self.base: dict[fx.Node, fx.Node] = {}
        for n in self.nodes:
            self.base[n] = n
            first = n.args[0] if n.args and isinstance(n.args[0], fx.Node) else None
            if first is not None and (self.is_view(n) or _short(n) in _IN_PLACE):
                self.base[n] = self.base[first]
        self.params = {n for n in self.nodes if n.op == "placeholder" and n.name in params}
        self.caches = {n for n in self.nodes if n.op == "placeholder" and n.name in caches}
        # weights: parameters and what the weight store holds (their quantized bytes)
        self.weights = self.params | {n for n in self.nodes if _is_weight_version(n, self)}

    def is_view(self, n: fx.Node) -> bool:
        if n.op != "call_function":
            return False
        if n.target is operator.getitem:
            return True
        name = _short(n)
        if name in ("reshape", "view", "_unsafe_view", "flatten") and n.args:
            src = n.args[0]
            while isinstance(src, fx.Node) and _short(src) in ("clone",):
                src = src.args[0]
            if isinstance(src, fx.Node) and _short(src) == "expand":
                return False  # materializes the expanded tensor: a copy
        if name == "to" and n.args and isinstance(n.args[0], fx.Node):
            src, out = _val(n.args[0]), _val(n)
            return src is not None and out is not None and src.dtype == out.dtype
        return name in _VIEWS

    def read_bytes(self, x: fx.Node) -> int:
        return min(_nbytes(_val(x)), _nbytes(_val(self.base[x])) or _nbytes(_val(x)))

    def from_param(self, x: fx.Node) -> bool:
        return self.base[x] in self.params

    def from_weight(self, x: fx.Node) -> bool:
        return self.base[x] in self.weights

    def from_cache(self, x: fx.Node) -> bool:
        return self.base[x] in self.caches


def _cache_layer_bytes(g: _Graph) -> int:
    return min((_nbytes(_val(c)) for c in g.caches), default=0)


def _fp4_cost(n: fx.Node, g: _Graph, ctx: dict) -> OpCost:
    name = _short(n)
    args = _tensor_args(n)
    launches, note, flops, kv = 1 + EXTRA_LAUNCHES.get(name, 0), "", 0, ""
    skip = []  # the master weight (autograd only), and x where the op reads x's operands instead
    if name in _NVFP4_GEMMS:
        call = GemmCall.of(n)
        skip = [call.weight] + ([call.x] if call.x_operands is not None else [])
        if call.w_ongrid is not None:  # the kernel reads the on-grid copy, not the packed bytes
            skip += [call.w.codes, call.w.scales]
    read = 0
    for _, x in args:
        if any(x is s for s in skip):
            continue
        b = g.read_bytes(x)
        if name in _GROUPED and g.from_weight(x):
            b = int(b * ctx["expert_fraction"])
        if name == "embedding" and g.from_param(x):  # reads its output's rows of the table
            b = min(b, sum(_nbytes(t) for t in _outputs(n)))
        read += b
    written = sum(_nbytes(t) for t in _outputs(n))
    if name in _NVFP4_GEMMS | _BF16_GEMMS:
        flops, note, launches, read = _gemm_facts(n, g, ctx, name, launches, read)
    if "attention" in name and name != "invariant_attention_mask_args":
        flops, read, kv = _attention_facts(n, g, ctx, read)
    if name in ("quantize", "quantize_with_ongrid") and per_expert_quantize(n.args[2]):
        launches += 1
        read += g.read_bytes(n.args[0])
        written += int(_val(n.args[0]).numel()) // _val(n.args[0]).shape[-1] * 4  # [E, N] FP32
        note = EXPERT_ROW_MAXIMA
    if name == "kv_cache_write":  # reads the positions and new rows, writes them (in place)
        read = sum(g.read_bytes(x) for i, x in args if i >= 2)
        written = sum(_nbytes(_val(x)) for i, x in args if i >= 3)
        kv = "writes the new tokens into the cache"
    never_copies = "attention" in name or name == "kv_cache_write"  # their outputs are no cache
    reads_cache = any(g.from_cache(x) for _, x in args) and not never_copies
    copies = reads_cache and written >= _cache_layer_bytes(g) > 0  # attention's output is none
    if copies:
        kv = _COPY
    return OpCost(
        op=op_name(n),
        nodes=[n.name],
        launches=launches,
        bytes_read=read,
        bytes_written=written,
        flops=flops,
        kv_cache=kv,
        copies_kv_cache=copies,
        note=note,
    )


def _gemm_facts(n, g: _Graph, ctx, name, launches, read):
    """FLOPs and the per-call on-grid dequantize of an NVFP4 GEMM at >= ONGRID rows per weight."""
    call = GemmCall.of(n) if name in _NVFP4_GEMMS else None
    x = n.args[0] if call is None else call.x  # the BF16 GEMMs' x: their first argument
    out = _outputs(n)[0]
    k = _val(x).shape[-1]
    flops = 2 * int(out.numel()) * int(k)
    note = ""
    if call is not None and call.w_ongrid is None:
        codes = _val(call.w.codes)
        experts = codes.shape[0] if codes.dim() == 3 else 1
        rows = -(-(int(out.numel()) // int(out.shape[-1])) // experts)
        if rows >= ONGRID_FORWARD_MIN_ROWS:
            full = int(codes.numel()) * 4  # BF16 copy of every weight: 2 values per code byte
            launches += 1
            read += _nbytes(codes) + _nbytes(_val(call.w.scales)) + full  # dequantize + GEMM reads
            note = f"dequantizes its packed weight per call ({rows} rows per weight)"
    return flops, note, launches, read


def _attention_facts(n, g: _Graph, ctx, read):
    """Attention reads K / V over the filled length L when the graph tells the kernel where each
    row's keys end (a length tensor, or a mask: the kernel stops at the block holding the last
    key a row sees, `codegen/invariant/attention_kernel.py`), else over the static cache (S);
    FLOPs 4*B*H*Tq*keys*D."""
    q, k, v = (_val(a) for a in n.args[:3])
    slots = k.shape[-2]
    length = n.args[4] if len(n.args) > 4 else None
    mask = n.args[5] if len(n.args) > 5 else None
    static = (not isinstance(length, fx.Node) or _short(length) == "full") and not isinstance(
        mask, fx.Node
    )
    keys = slots if static else min(ctx["context"], slots)
    if not static:
        read -= int((_nbytes(k) + _nbytes(v)) * (1 - keys / slots))
    flops = 4 * int(q.numel()) * int(keys)
    kv = "reads the whole static cache (S slots)" if static else "reads the filled length (L)"
    return flops, read, kv


def _extern_cost(n: fx.Node, g: _Graph, ctx: dict) -> OpCost:
    name = _short(n)
    args = _tensor_args(n)
    outs = _outputs(n)
    kv, flops = "", 0
    if name in _IN_PLACE:  # writes its source's elements into arg 0
        src = [x for i, x in args if i > 0]
        read = sum(g.read_bytes(x) for x in src)
        written = _nbytes(_val(src[-1])) if src else 0  # the values written (last argument)
        if g.from_cache(n.args[0]):
            kv = "writes the new tokens into the cache"
    else:
        read = 0
        for _, x in args:
            b = g.read_bytes(x)
            if name in _GROUPED and g.from_weight(x):
                b = int(b * ctx["expert_fraction"])
            read += b
        written = sum(_nbytes(t) for t in outs)
    if name in _GEMMS:
        flops = 2 * int(outs[0].numel()) * int(_val(n.args[0]).shape[-1])
        if name == "_grouped_mm" and outs[0].dim() == 3 and _val(n.args[0]).dim() == 2:
            flops //= int(outs[0].shape[0])  # [N, T] x [T, K] -> [E, N, K]: each expert its rows
    if name in _ATTENTION:
        flops = 4 * int(_val(n.args[0]).numel()) * int(_val(n.args[1]).shape[-2])
        kv = "reads the whole static cache (S slots)"
    return OpCost(
        op=op_name(n),
        nodes=[n.name],
        launches=1,
        bytes_read=read,
        bytes_written=written,
        flops=flops,
        kv_cache=kv,
    )


def _is_weight_version(n: fx.Node, g: _Graph) -> bool:
    if not (op_name(n).startswith("fp4_compile.") and _short(n) in _WEIGHT_CACHED):
        return False
    first = n.args[0]
    items = first if isinstance(first, (list, tuple)) else [first]
    return all(isinstance(x, fx.Node) and g.from_param(x) for x in items)


def step_costs(
    gm: fx.GraphModule,
    *,
    params: set[str],
    caches: set[str],
    context: int,
    expert_fraction: float,
) -> tuple[list[OpCost], list[OpCost]]:
    """(rows of the step, rows run once per weight version) of graph `gm`, by the module's rules."""
    g = _Graph(gm, params, caches)
    ctx = {"context": context, "expert_fraction": expert_fraction}
    rows, per_version = [], []
    stage: dict[fx.Node, int] = {}  # kernels (not fusible ops) on the longest path from inputs
    kernel: set[fx.Node] = set()
    fusible: list[fx.Node] = []
    for n in g.nodes:
        stage[n] = max((stage[x] + (x in kernel) for x in n.all_input_nodes), default=0)
        if n.op != "call_function" or g.is_view(n):
            continue
        if op_name(n).startswith("fp4_compile."):
            kernel.add(n)
            (per_version if _is_weight_version(n, g) else rows).append(_fp4_cost(n, g, ctx))
        elif _short(n) in EXTERN:
            kernel.add(n)
            rows.append(_extern_cost(n, g, ctx))
        else:
            fusible.append(n)
    rows.extend(_fused_rows(g, fusible, stage))
    order = {n.name: i for i, n in enumerate(g.nodes)}
    rows.sort(key=lambda r: order[r.nodes[0]])
    return rows, per_version


def _fused_rows(g: _Graph, fusible: list[fx.Node], stage: dict) -> list[OpCost]:
    """Connected runs of fusible ops at the same stage: one launch each."""
    parent = {n: n for n in fusible}

    def find(n):
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    def producer(x):  # the fusible op behind a chain of views, or None
        while (
            x.op == "call_function" and g.is_view(x) and x.args and isinstance(x.args[0], fx.Node)
        ):
            x = x.args[0]
        return x if x in parent else None

    for n in fusible:
        for _, x in _tensor_args(n):
            p = producer(x)
            if p is not None and stage[p] == stage[n]:
                parent[find(p)] = find(n)
    groups: dict[fx.Node, list[fx.Node]] = {}
    for n in fusible:
        groups.setdefault(find(n), []).append(n)
    users: dict[fx.Node, list[fx.Node]] = {n: [] for n in g.nodes}
    for n in g.nodes:
        for x in n.all_input_nodes:
            users[x].append(n)
    rows = []
    for members in groups.values():
        inside = set(members)
        read, seen, cache_in = 0, set(), False
        for n in members:
            for _, x in _tensor_args(n):
                if producer(x) in inside or x in seen:
                    continue
                seen.add(x)
                cache_in |= g.from_cache(x)
                gather = _short(n) == "embedding" and g.from_param(x)  # reads its rows only
                read += min(_nbytes(_val(n)), g.read_bytes(x)) if gather else g.read_bytes(x)
        written = sum(_nbytes(_val(n)) for n in members if _leaves(n, inside, users, g))
        copies = cache_in and written >= _cache_layer_bytes(g) > 0
        name = "fused: " + "+".join(sorted({_short(n) for n in members}))[:80]
        rows.append(
            OpCost(
                op=name,
                nodes=[n.name for n in members],
                launches=1,
                bytes_read=read,
                bytes_written=written,
                flops=0,
                copies_kv_cache=copies,
                kv_cache=_COPY if copies else "",
            )
        )
    return rows


def _leaves(n: fx.Node, inside: set, users: dict, g: _Graph) -> bool:
    """Whether n's value is read outside its fused run (directly or through views)."""
    stack = list(users[n])
    while stack:
        u = stack.pop()
        if u.op == "output" or (u not in inside and not g.is_view(u)):
            return True
        if g.is_view(u):
            stack.extend(users[u])
    return False
