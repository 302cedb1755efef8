"""Last pass, verify: nothing eligible left unlowered, no non-invariant reduction left (strict
recipes), and the op census: the ordered list of compute ops of the graph, which the learner's
and the exported rollout's graphs must share."""

from __future__ import annotations

import operator
import warnings

import torch
import torch.fx as fx

from ..recipe import NVFP4Recipe
from ..weight_policy import SHAPE_REASON
from .graph_utils import fake, module_path, op_name
from .report import LoweringReport

aten = torch.ops.aten

# GEMM-like ops: left in a graph they run on stock kernels whose reduction order is not ours.
_GEMM_FUNCTIONS = {
    torch._C._nn.linear,
    torch.matmul,
    torch.mm,
    torch.bmm,
    torch.addmm,
    torch.einsum,
    operator.matmul,
    torch._C._nn.scaled_dot_product_attention,
}
_GEMM_METHODS = {"matmul", "mm", "bmm", "__matmul__"}
_GEMM_OVERLOADS = {
    aten.linear,
    aten.mm,
    aten.bmm,
    aten.addmm,
    aten.matmul,
    aten.baddbmm,
    aten.scaled_dot_product_attention,
    aten._scaled_dot_product_flash_attention,
    aten._scaled_dot_product_efficient_attention,
    aten._grouped_mm,
}

# Reductions: allowed only over a small static extent (<= TINY_REDUCTION elements, e.g. the
# top-k combine of MoE), which Inductor reduces sequentially per row.
_REDUCE_FUNCTIONS = {
    torch.sum,
    torch.mean,
    torch.softmax,
    torch.log_softmax,
    torch.nn.functional.softmax,
    torch.nn.functional.log_softmax,
    torch.logsumexp,
    torch.amax,
    torch.max,
    torch.var,
    torch.norm,
    torch.cumsum,
    torch.prod,
}
_REDUCE_METHODS = {
    "sum",
    "mean",
    "softmax",
    "log_softmax",
    "logsumexp",
    "amax",
    "var",
    "norm",
    "prod",
}
_REDUCE_OVERLOADS = {
    aten.sum,
    aten.mean,
    aten._softmax,
    aten.softmax,
    aten._log_softmax,
    aten.log_softmax,
    aten.logsumexp,
    aten.amax,
    aten.var,
    aten.linalg_vector_norm,
    aten.prod,
}
TINY_REDUCTION = 16


def _kind(node: fx.Node) -> str | None:
    if node.op == "call_method":
        if node.target in _GEMM_METHODS:
            return "gemm"
        if node.target in _REDUCE_METHODS:
            return "reduction"
        return None
    if node.op != "call_function":
        return None
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        if t.namespace == "fp4_compile":
            return "minite"
        if t.overloadpacket in _GEMM_OVERLOADS:
            return "gemm"
        if t.overloadpacket in _REDUCE_OVERLOADS:
            return "reduction"
        if t.namespace == "transformers" and "grouped_mm" in t.name():
            return "gemm"
        return None
    if t in _GEMM_FUNCTIONS or getattr(t, "__name__", "") == "_grouped_mm":
        return "gemm"
    if t in _REDUCE_FUNCTIONS:
        return "reduction"
    return None


def _reduced_extent(node: fx.Node) -> int | None:
    """Number of elements each output of a reduction node combines (None if unknown/dynamic)."""
    src = fake(node.args[0]) if node.args else None
    out = fake(node)
    if src is None or out is None:
        return None
    try:
        total, kept = int(src.numel()), int(out.numel())
    except (TypeError, RuntimeError):  # symbolic sizes
        dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        if isinstance(dims, int):
            dims = [dims]
        if not dims:
            return None
        try:
            extent = 1
            for d in dims:
                extent *= int(src.shape[d])
            return extent
        except (TypeError, RuntimeError):
            return None
    return total // max(kept, 1) if kept else None


def _is_float_reduction(node: fx.Node) -> bool:
    """Integer and boolean reductions are exact, so their order cannot matter."""
    src = fake(node.args[0]) if node.args else None
    return src is None or src.dtype.is_floating_point


def op_census(gm: fx.GraphModule) -> list[str]:
    """Ordered names of the compute ops (fp4_compile ops, leftover GEMMs and reductions)."""
    return [op_name(n) for n in gm.graph.nodes if _kind(n) is not None]


def _shape_fallbacks(recipe: NVFP4Recipe, report: LoweringReport) -> list[str]:
    """GEMMs that stay BF16 only because of their shape. A batch-invariant NVFP4 recipe (strict)
    refuses them (returned as problems) unless `bf16_modules` names them; any other recipe gets
    one warning line naming them. Never silent."""
    odd = [d for d in report.gemms if d.precision == "bf16" and d.reason.startswith(SHAPE_REASON)]
    if not odd or not recipe.quantize:
        return []
    where = ", ".join(f"{d.module or '<root>'} {d.shape}" for d in odd)
    fix = "list them in NVFP4Recipe.bf16_modules (fnmatch patterns) to accept BF16 there"
    if recipe.batch_invariant:
        return [f"{len(odd)} GEMM(s) would stay BF16 ({SHAPE_REASON}): {where}; {fix}"]
    warnings.warn(
        f"minite: {len(odd)} GEMM(s) stay BF16 ({SHAPE_REASON}): {where}; {fix}", stacklevel=2
    )
    return []


def verify(gm: fx.GraphModule, recipe: NVFP4Recipe, report: LoweringReport) -> None:
    problems = _shape_fallbacks(recipe, report)
    for decision in report.gemms:
        if not decision.lowered_to:
            problems.append(
                f"GEMM at {decision.module or '<root>'} ({decision.kind} {decision.shape}) was not lowered"
            )
    for node in gm.graph.nodes:
        kind = _kind(node)
        where = module_path(node) or "<root>"
        if kind == "gemm":
            problems.append(f"{op_name(node)} at {where} is left on a stock kernel")
        elif kind == "reduction" and recipe.batch_invariant and _is_float_reduction(node):
            extent = _reduced_extent(node)
            if extent is None or extent > TINY_REDUCTION:
                problems.append(
                    f"{op_name(node)} at {where} reduces {extent if extent else 'an unknown number of'} elements "
                    f"on a stock kernel (only <= {TINY_REDUCTION} are allowed in a batch-invariant recipe)"
                )
        elif (
            recipe.batch_invariant
            and node.op in ("call_function", "call_method")
            and "sort" in op_name(node)
            and not node.kwargs.get("stable", False)
        ):
            problems.append(
                f"{op_name(node)} at {where} is an unstable sort (equal keys in an order no "
                "value fixes); the stable_sorts pass should have made it stable"
            )
    report.census = op_census(gm)
    if problems:
        summary = (
            "minite could not lower this graph completely (nothing falls back silently):\n  - "
            + "\n  - ".join(problems)
            + "\n"
            + _eager_attention_hint(gm)
        )
        raise LoweringError(summary + report.table(), summary=summary)


ATTENTION_MODULES = ("self_attn", "attn", "attention", "self_attention")


def _eager_attention_hint(gm: fx.GraphModule) -> str:
    """A stock matmul left inside an attention module is the eager attention pattern (matmul,
    scale, mask, softmax, matmul): name it and the fix rather than leave the user with
    `torch.matmul` nodes."""
    for node in gm.graph.nodes:
        if _kind(node) != "gemm":
            continue
        last = (module_path(node) or "").rsplit(".", 1)[-1]
        if last in ATTENTION_MODULES:
            return (
                f"{module_path(node)} computes attention with stock matmuls: this is the eager "
                "attention implementation (attn_implementation='eager'), which minite does not "
                "lower. minite lowers scaled_dot_product_attention: load the model with "
                "attn_implementation='sdpa' (from_pretrained(..., attn_implementation='sdpa') or "
                "model.set_attn_implementation('sdpa')). Attention that needs eager (Gemma2's "
                "logit soft-capping) is not supported yet.\n"
            )
    return ""


class LoweringError(RuntimeError):
    """A graph that the recipe requires to be fully lowered still holds stock GEMMs/reductions.
    `summary`: the problems and their fix without the report table (what a one-line error
    shows; the message holds both)."""

    def __init__(self, message: str, *, summary: str | None = None):
        super().__init__(message)
        self.summary = summary or message


# an inference graph's fused form -> the op the learner's graph has in its place
_INFERENCE_FORMS = {
    "fp4_compile::invariant_rms_norm_pair_rotary": ("fp4_compile::invariant_rms_norm_pair",),
    "fp4_compile::rotary_tables": ("fp4_compile::cos", "fp4_compile::sin"),
}


_BOOKKEEPING = (
    "fp4_compile::kv_cache_write",
    "fp4_compile::invariant_attention_mask_args",
    "fp4_compile::invariant_position_mask",
)


def normalized_census(census: list[str]) -> list[str]:
    """Census names without the IR spelling, so a Dynamo graph's and an exported graph's compute
    ops compare: 'Tensor.sum' / 'torch.sum' / 'aten::sum.dim_IntList' -> 'sum'; fp4_compile ops
    keep their names. Integer bookkeeping (cumsum of routing counts) and the rollout's KV-cache
    write (no learner graph has a cache) are dropped; the norm pair with the rotary in it (an
    inference graph's, `fuse_rotary_into_norm_pairs`) counts as the norm pair (the rotary's
    pointwise ops are no compute op here), and the rotary tables in one op (`fuse_rotary_tables`,
    no-grad graphs) as the cos and sin the training graph has. A mask's kernel arguments are integer bookkeeping
    too, made where the mask is (the rollout's position mask before the decoder, the learner's
    before its first attention): dropped."""
    out = []
    for name in census:
        if name.startswith(_BOOKKEEPING):
            continue
        if name.startswith("fp4_compile::"):
            op = name.split(".")[0]
            out.extend(_INFERENCE_FORMS.get(op, (op,)))
            continue
        base = name.split("::")[-1].split(".")[0] if "::" in name else name.split(".")[-1]
        if base in ("cumsum",):
            continue
        out.append(base)
    return out
