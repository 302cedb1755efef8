"""Pass, emit attention parts: in a bound inference graph (the rollout engine's, after
`defer_decode_codes`), a decode attention (`invariant_attention`, BF16, Tq = 1) whose output
reaches only the attention output projection, an NVFP4 linear quantizing its own operand
(`nvfp4_linear`, per-row activation scales), through views, transposes and contiguous copies
(the heads concatenated per token), becomes `invariant_attention_parts`, which also returns
each head's max |out| (its kernel's epilogue), and that linear `nvfp4_linear_with_parts`
reading them: at a decode GEMM the prologue folds the per-head maxima instead of a
`chunk_abs_max` launch over the output (one launch fewer per layer). The same bits: a max is
exact in any grouping, and the heads of token b are exactly row b of the linear's operand
(checked by replaying the chain on the elements' indices). Left as it is (a note): the lse
read (a graph with a backward), Tq > 1, not BF16, another reader, another chain, a GEMM of
other scales. The new ops have no backward: the caller runs this on graphs that track no
gradient. Returns the number of attentions rewritten; `report` counts `attention_parts_emitted`.
"""

from __future__ import annotations

import operator

import torch
import torch.fx as fx

from .. import codegen  # noqa: F401  (registers the fp4_compile ops)
from ..codegen.nvfp4.gemm_call import GemmCall, encode_recipe, is_gemm
from .graph_utils import erase_dead, fake, insert_call
from .report import LoweringReport

aten = torch.ops.aten
_METHODS = ("reshape", "view", "transpose", "permute", "contiguous")
_FUNCTIONS = (torch.reshape, torch.transpose, torch.permute)
_OVERLOADS = (aten.reshape.default, aten.view.default, aten._unsafe_view.default)
_OVERLOADS += (aten.transpose.int, aten.permute.default, aten.clone.default)


def _layout_op(node: fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in _METHODS
    return node.op == "call_function" and (node.target in _FUNCTIONS or node.target in _OVERLOADS)


def _chain(out: fx.Node) -> tuple[list[fx.Node], fx.Node | None]:
    """(the layout ops from the attention's output on, the nvfp4_linear reading the last one,
    or None)."""
    chain, node = [], out
    while len(node.users) == 1:
        nxt = next(iter(node.users))
        if is_gemm(nxt, "nvfp4_linear"):
            return chain, (nxt if GemmCall.of(nxt).x is node else None)
        if not _layout_op(nxt) or nxt.args[0] is not node:
            return chain, None
        chain.append(nxt)
        node = nxt
    return chain, None


def _rows_are_tokens(q: torch.Tensor, chain: list[fx.Node]) -> bool:
    """Whether the chain, replayed on the indices of the output's elements [B, Hq, 1, D], gives
    rows whose elements are exactly one token's heads, token b in row b."""
    b, hq, _, d = q.shape
    t = torch.arange(b * hq * d).reshape(b, hq, 1, d)
    for node in chain:
        rest = [*node.args[1:], *node.kwargs.values()]
        if any(isinstance(a, fx.Node) for a in rest):
            return False
        if node.op == "call_method":
            t = getattr(t, node.target)(*node.args[1:], **node.kwargs)
        elif node.target is aten.clone.default:
            t = t.clone()
        else:
            t = node.target(t, *node.args[1:], **node.kwargs)
    rows = t.reshape(-1, t.shape[-1]) if t.dim() else t
    if rows.shape != (b, hq * d):
        return False
    return bool(((rows.sort(dim=1).values) == torch.arange(b * hq * d).reshape(b, -1)).all())


def _refusal(attn: fx.Node) -> tuple[str | None, tuple]:
    q = fake(attn.args[0])
    if q is not None and not all(isinstance(s, int) for s in q.shape):
        return "a symbolic shape (its rows cannot be replayed)", ()
    if q is None or q.dtype != torch.bfloat16 or q.dim() != 4 or q.shape[2] != 1:
        return "not a BF16 decode (Tq = 1)", ()
    if q.requires_grad:
        return "the query requires grad", ()
    users = list(attn.users)
    if len(users) != 1 or users[0].target is not operator.getitem or users[0].args[1] != 0:
        return "the attention's outputs are read other than its out alone", ()
    out = users[0]
    chain, gemm = _chain(out)
    if gemm is None:
        return "its out is read by other ops than views on the way to one nvfp4_linear", ()
    call = GemmCall.of(gemm)
    if call.x_amax is not None or call.recipe.activation.global_scale != "per_row":
        return "the linear has no per-row activation scales", ()
    if not _rows_are_tokens(q, chain):
        return "the linear's rows are not the tokens' heads", ()
    return None, (out, chain, gemm, call)


def emit_attention_parts(graph: fx.Graph, report: LoweringReport | None = None) -> int:
    ops = torch.ops.fp4_compile
    refused: dict[str, int] = {}
    done = 0
    for attn in list(graph.nodes):
        if attn.op != "call_function" or attn.target is not ops.invariant_attention.default:
            continue
        why, found = _refusal(attn)
        if why is not None:
            refused[why] = refused.get(why, 0) + 1
            continue
        out, chain, gemm, call = found
        new = insert_call(
            graph, ops.invariant_attention_parts.default, attn.args, before=attn, like=attn,
            kwargs=dict(attn.kwargs),
        )  # fmt: skip
        new_out = insert_call(graph, operator.getitem, (new, 0), after=new, like=out)
        parts = insert_call(graph, operator.getitem, (new, 2), after=new_out, like=out)
        out.replace_all_uses_with(new_out)
        w = call.weight_operand()
        last = chain[-1] if chain else new_out
        args = (last, parts, w.codes, w.scales, w.global_decode, call.w_ongrid, call.bias)
        with graph.inserting_before(gemm):  # the same output as the GEMM's: its meta
            linear = graph.call_function(
                ops.nvfp4_linear_with_parts.default, (*args, encode_recipe(call.recipe))
            )
        linear.meta.update(gemm.meta)  # (its weights' fakes may be of the store's own fake mode)
        gemm.replace_all_uses_with(linear)
        erase_dead(graph, [gemm, out, attn])
        done += 1
    if report is not None:
        if done:
            report.count("attention_parts_emitted", done)
        for why, n in refused.items():
            report.notes.append(f"attention parts not emitted at {n} site(s): {why}")
    return done
