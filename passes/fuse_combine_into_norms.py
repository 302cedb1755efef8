"""Pass, fuse the MoE combine into the norm after it: in an inference graph (the rollout
engine's step, an exported rollout program), `fp4_compile::moe_combine` whose output reaches
only the residual add of the next RMSNorm (`invariant_add_rms_norm`, made by
`fuse_residual_adds`: the next layer's input norm, or the final norm), through no-op casts and
views (transformers' `.to(dtype)` and `.reshape(B, T, H)`), becomes with that norm ONE
`fp4_compile::moe_combine_add_rms_norm` (`codegen/moe/combine_add_rms_norm.py`):

    c = moe_combine(x, w, idx, k);  y, h = invariant_add_rms_norm(r, c.reshape(..), weight, eps)
        -> y, h = moe_combine_add_rms_norm(r, x, w, idx, k, weight, eps)

one launch instead of two, y and h (the next residual add's input) bit for bit (the op runs
the two kernels' code). The combine may be either addend (an add is commutative bit for bit).
The combine's `idx_inverse` is only read by its backward, which an inference graph has none of.

Left as it is, with the reason in the report's notes:
- a graph that tracks a gradient (the learner's training forward): the fused op has no backward;
- a combine with a `row_mask` (the fused kernel has none);
- not BF16 (x, w, the residual and the norm's weight): the roundings the kernel repeats are
  BF16's (an FP32 sum could be contracted into an FMA by the compiler);
- a combine (or a cast / view of it) read by anything but the next one in that chain.
Runs after `fuse_residual_adds`; `explain` counts `combine_fused_into_norm`.

The strict recipe's next norm quantizes (`add_rms_norm_quantize`), which this PIPELINE pass
leaves; `fuse_combine_into_norm_parts` takes it after the weight store binding has made it
`rms_norm_quantize_parts` (`defer_decode_codes`): the combine, the residual add, the norm and
its row maxima in one launch, `moe_combine_add_rms_norm_parts` (tests/passes/
test_fuse_combine_into_norm_parts.py, tests/rollout/test_store_binding_fusions_engine.py).
"""

from __future__ import annotations

import torch
import torch.fx as fx

from .. import codegen  # noqa: F401  (registers the fp4_compile ops)
from ..recipe import NVFP4Recipe
from .graph_utils import erase_dead, fake, insert_call, tracks_gradients
from .patterns import is_op
from .report import LoweringReport

aten = torch.ops.aten
_VIEWS = dict(
    functions=(torch.reshape,),
    methods=("reshape", "view"),
    overloads=(aten.reshape, aten.view, aten._unsafe_view),
)


def _is_op(node, packet) -> bool:
    """node calls the op (its default overload, as passes insert it, or the packet, as Dynamo
    records a user's own call)."""
    return isinstance(node, fx.Node) and node.target in (packet, packet.default)


def _readers(node: fx.Node) -> list[fx.Node]:
    """node's users but an exported graph's metadata asserts (erase_dead drops those)."""
    return [u for u in node.users if "assert_tensor_metadata" not in str(u.target)]


def _same_dtype_cast(node: fx.Node) -> bool:
    """`t.to(dtype)` / `_to_copy(t, dtype=dtype)` with t already of that dtype: the same bits."""
    if not is_op(node, methods=("to",), overloads=(aten._to_copy, aten.to)):
        return False
    src, out = fake(node.args[0]), fake(node)
    if src is None or out is None or src.dtype != out.dtype or src.device != out.device:
        return False
    rest = [*node.args[1:], *(v for key, v in node.kwargs.items() if key != "dtype")]
    return all(isinstance(a, torch.dtype) for a in rest)


def _chain(combine: fx.Node, norm_op) -> tuple[list[fx.Node], fx.Node | None]:
    """(the casts / views from `combine` to the norm, the `norm_op` node reading the last of
    them, or None)."""
    chain, node = [], combine
    while True:
        readers = _readers(node)
        if len(readers) != 1:
            return chain, None
        nxt = readers[0]
        if _is_op(nxt, norm_op):
            return chain, nxt
        if not (_same_dtype_cast(nxt) or is_op(nxt, **_VIEWS)) or nxt.args[0] is not node:
            return chain, None
        chain.append(nxt)
        node = nxt


def _refusal(
    combine: fx.Node, last: fx.Node, norm: fx.Node | None, training: bool, num_args: int = 4
):
    if norm is None:
        return "its output is read by other ops than one add + RMSNorm (through casts, views)"
    if training:
        return "a graph that tracks a gradient (the fused op has no backward)"
    row_mask = combine.args[4] if len(combine.args) > 4 else combine.kwargs.get("row_mask")
    if row_mask is not None:
        return "a combine with a row_mask"
    if norm.kwargs or len(norm.args) != num_args or last not in norm.args[:2] or norm.args[0] is norm.args[1]:  # fmt: skip
        return "the norm's residual add does not read the combine once, as an addend"
    values = [fake(a) for a in (*combine.args[:2], *norm.args[:3]) if a is not None]
    if any(v is None or v.dtype != torch.bfloat16 for v in values):
        return "not BF16 (the kernel repeats BF16's roundings)"
    return None


def fuse_combine_into_norms(
    gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport
) -> None:
    graph = gm.graph
    training = tracks_gradients(graph)
    fused_op = torch.ops.fp4_compile.moe_combine_add_rms_norm.default
    refused: dict[str, int] = {}
    for combine in list(graph.nodes):
        if not _is_op(combine, torch.ops.fp4_compile.moe_combine):
            continue
        chain, norm = _chain(combine, torch.ops.fp4_compile.invariant_add_rms_norm)
        last = chain[-1] if chain else combine
        why = _refusal(combine, last, norm, training)
        if why is not None:
            refused[why] = refused.get(why, 0) + 1
            continue
        residual = norm.args[1] if norm.args[0] is last else norm.args[0]
        x, w, idx, k = combine.args[:4]
        args = (residual, x, w, idx, k, *norm.args[2:])
        fused = insert_call(graph, fused_op, args, before=norm, like=norm)
        norm.replace_all_uses_with(fused)  # the same (y, h), read by the same getitems
        erase_dead(graph, [norm, *reversed(chain), combine])
        report.count("combine_fused_into_norm")
    for why, n in refused.items():
        report.notes.append(f"moe_combine not fused into the next norm at {n} site(s): {why}")
    gm.recompile()


def fuse_combine_into_norm_parts(graph: fx.Graph, report: LoweringReport | None = None) -> int:
    """The strict recipe's form, on a bound inference graph after `defer_decode_codes` (the
    caller runs it on graphs that track no gradient): `moe_combine` whose output reaches only
    the residual add of `rms_norm_quantize_parts` (the next layer's input norm leaving its codes
    to the q/k/v decode GEMM), through no-op casts and views, becomes with that norm ONE
    `fp4_compile::moe_combine_add_rms_norm_parts` (`codegen/moe/combine_add_rms_norm_parts.py`):
    the same five outputs, bit for bit, one launch at decode instead of two. The refusals are
    PIPELINE's (a row_mask, not BF16, other readers) and an input that requires grad. Returns
    the number of combines fused; `report` counts `combine_fused_into_norm` and notes refusals."""
    norm_op = torch.ops.fp4_compile.rms_norm_quantize_parts
    fused_op = torch.ops.fp4_compile.moe_combine_add_rms_norm_parts.default
    refused: dict[str, int] = {}
    done = 0
    for combine in list(graph.nodes):
        if not _is_op(combine, torch.ops.fp4_compile.moe_combine):
            continue
        chain, norm = _chain(combine, norm_op)
        last = chain[-1] if chain else combine
        grad = any(getattr(fake(a), "requires_grad", False) for a in combine.args[:2])
        why = _refusal(combine, last, norm, grad, num_args=5)
        if why is None and norm.args[1] is None:
            why = "the norm has no residual add"
        if why is not None:
            refused[why] = refused.get(why, 0) + 1
            continue
        residual = norm.args[1] if norm.args[0] is last else norm.args[0]
        x, w, idx, k = combine.args[:4]
        args = (residual, x, w, idx, k, *norm.args[2:])
        fused = insert_call(graph, fused_op, args, before=norm, like=norm)
        norm.replace_all_uses_with(fused)  # the same five outputs, read by the same getitems
        erase_dead(graph, [norm, *reversed(chain), combine])
        done += 1
    if report is not None:
        if done:
            report.count("combine_fused_into_norm", done)
        for why, n in refused.items():
            report.notes.append(f"moe_combine not fused into the next norm at {n} site(s): {why}")
    return done
