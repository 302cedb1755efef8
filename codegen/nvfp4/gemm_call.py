"""One call of an NVFP4 GEMM op, by name: the only place the GEMM ops' arguments are ordered.

Shape legend: M tokens, T tokens sorted by expert, K in-features, N out-features, E experts.

The four GEMM ops of the `fp4_compile::` namespace take one argument list, `OP_ARGS` below:
- nvfp4_linear:               x [M, K], a weight [N, K], bias                (dense)
- nvfp4_grouped_mm:           x [T, K], a weight [E, N, K], offsets [E]      (MoE experts)
- nvfp4_linear_quantized:     nvfp4_linear + x's operands (x_ongrid, x_gd, xt_ongrid, xt_gd)
- nvfp4_grouped_mm_quantized: nvfp4_grouped_mm + x's per-row operand (x_ongrid, x_gd)
All four are registered from this table (`register_gemm`: schema, implementation and fake
handed a `GemmCall`, autograd); their schemas are the ones stored rollout artifacts hold
(tests/codegen/nvfp4/test_gemm_call.py pins them).

Code that calls an op, inserts a node of one, or reads one builds or reads a `GemmCall`:

    call = GemmCall(x=x, weight=w, w=w_q, recipe=recipe, bias=b)   # w_q: NVFP4Tensor (16x16)
    y = call.run()                                                # torch.ops.fp4_compile.*
    node = insert_call(graph, call.overload(), call.args(), ...)  # a graph node of it
    call = GemmCall.of(node)                                      # and back, by name

The recipe crosses the op boundary in one encoded form, its numerics key (`encode_recipe`:
`NVFP4Recipe.numerics_key`, compact JSON), decoded in one place (`decode_recipe`, which the ops
and `GemmCall.of` call). In a graph, the fields hold the nodes of the arguments.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ...format import NVFP4Tensor
from ...recipe import NVFP4Recipe

_BASE = ("x", "weight", "w_codes", "w_scales", "w_global_decode")
_TAIL = ("x_amax", "recipe", "w_ongrid", "site")
# op name -> its arguments in schema order (the schema's `recipe` is the encoded recipe)
OP_ARGS: dict[str, tuple[str, ...]] = {
    "nvfp4_linear": (*_BASE, "bias", *_TAIL),
    "nvfp4_grouped_mm": (*_BASE, "offsets", *_TAIL, "x_index", "x_perm"),
    "nvfp4_linear_quantized": (*_BASE, "bias", *_TAIL, "x_ongrid", "x_gd", "xt_ongrid", "xt_gd"),
    "nvfp4_grouped_mm_quantized": (
        *_BASE,
        "offsets",
        *_TAIL,
        "x_index",
        "x_perm",
        "x_ongrid",
        "x_gd",
    ),
}
# the trailing arguments nvfp4_linear / nvfp4_grouped_mm may leave out, and their defaults
DEFAULTS = {"w_ongrid": None, "site": 0, "x_index": None, "x_perm": None}
GEMM_OPS = tuple(OP_ARGS)
# each argument's schema type (`site` an int, SymInt as custom_op infers it)
ARG_TYPES = {
    "x": "Tensor",
    "weight": "Tensor",
    "w_codes": "Tensor",
    "w_scales": "Tensor",
    "w_global_decode": "Tensor",
    "bias": "Tensor?",
    "offsets": "Tensor",
    "x_amax": "Tensor?",
    "recipe": "str",
    "w_ongrid": "Tensor?",
    "site": "SymInt",
    "x_index": "Tensor?",
    "x_perm": "Tensor?",
    "x_ongrid": "Tensor",
    "x_gd": "Tensor",
    "xt_ongrid": "Tensor",
    "xt_gd": "Tensor",
}


def op_schema(op_name: str) -> str:
    """The registered schema of GEMM op `op_name`, from the table (the `_quantized` ops take
    every argument; the base ops default their trailing `DEFAULTS`)."""
    args = []
    for name in OP_ARGS[op_name]:
        arg = f"{ARG_TYPES[name]} {name}"
        if name in DEFAULTS and not op_name.endswith("_quantized"):
            arg += f"={DEFAULTS[name]}"
        args.append(arg)
    return f"({', '.join(args)}) -> Tensor"


def encode_recipe(recipe: NVFP4Recipe) -> str:
    """The recipe as the ops' string argument (`NVFP4Recipe.numerics_key`)."""
    if not isinstance(recipe, NVFP4Recipe):
        raise TypeError(f"recipe must be an NVFP4Recipe, got {type(recipe).__name__}")
    return recipe.numerics_key


def decode_recipe(numerics: str) -> NVFP4Recipe:
    """The recipe of an NVFP4 op's string argument (`NVFP4Recipe.from_numerics_key`, cached),
    checked for what the ops support: the one decode of every op and of `GemmCall.of`."""
    recipe = NVFP4Recipe.from_numerics_key(numerics)
    if not recipe.quantize:
        raise ValueError("recipe.quantize is False: NVFP4 ops need a quantizing recipe")
    if recipe.grad.global_scale == "static":
        raise ValueError("recipe.grad.global_scale='static' is not supported (no calibrated amax)")
    return recipe


class QuantizedWeight(NamedTuple):
    """A quantized weight as the ops take it: packed codes [.., N, K/2] (or [.., N, 0] when
    quantized on-grid only), E4M3 block-scale BYTES as uint8 [.., N, K/16], FP32 global decode."""

    codes: Any
    scales: Any
    global_decode: Any

    @classmethod
    def of(cls, w: NVFP4Tensor | QuantizedWeight | tuple) -> QuantizedWeight:
        if isinstance(w, NVFP4Tensor):
            if w.block != "16x16":
                raise TypeError(f"w must be a 16x16 NVFP4Tensor (quantize_weight), got {w!r}")
            return cls(w.codes, w.block_scales.view(torch.uint8), w.global_decode)
        if isinstance(w, tuple) and len(w) == 3:
            return cls(*w)
        raise TypeError(
            f"w must be an NVFP4Tensor or (codes, scale bytes, global decode), got {type(w)}"
        )


class ActivationOperands(NamedTuple):
    """x's quantization given to a `_quantized` op: on-grid BF16 x [M, K] and its global decode;
    for the dense op also X^T's on-grid operand [K, M16] and its global decode ([0] each when
    none: `gemm.no_transposed_operand`). The grouped op takes the first two only."""

    ongrid: Any
    global_decode: Any
    t_ongrid: Any = None
    t_global_decode: Any = None


def _ops():
    return torch.ops.fp4_compile


def gemm_op_name(target) -> str | None:
    """The GEMM op name of a node target (an overload or the op packet), else None."""
    schema = getattr(target, "_schema", None)  # an overload
    name = getattr(schema, "name", None) or getattr(target, "_qualified_op_name", None)
    if not isinstance(name, str) or not name.startswith("fp4_compile::"):
        return None
    name = name.split("::", 1)[1]
    return name if name in OP_ARGS else None


def is_gemm(node, *names: str) -> bool:
    """Whether fx node `node` calls one of the named GEMM ops (any of the four by default)."""
    if getattr(node, "op", None) != "call_function":
        return False
    name = gemm_op_name(node.target)
    return name is not None and (not names or name in names)


class GemmCall(NamedTuple):
    """One NVFP4 GEMM call by name. Construct it with keywords. `offsets` given: the experts'
    grouped op; `x_operands` given: the op reading x's quantization instead of quantizing x.

    x: activation [.., K]; weight: the master weight (autograd returns its gradient,
    straight-through); w: the quantized weight (an `NVFP4Tensor` or a `QuantizedWeight`);
    recipe: the `NVFP4Recipe` (encoded at the op boundary); bias (dense only); offsets: int32
    [E] group ends; x_amax: float32 static amax (static recipes); w_ongrid: the on-grid BF16
    copy of w; site: the stochastic-rounding call-site id; x_index / x_perm (grouped only): the
    folded token gather and its sort permutation; x_operands: `ActivationOperands`."""

    x: Any
    weight: Any
    w: Any
    recipe: NVFP4Recipe
    bias: Any = None
    offsets: Any = None
    x_amax: Any = None
    w_ongrid: Any = None
    site: Any = 0
    x_index: Any = None
    x_perm: Any = None
    x_operands: ActivationOperands | None = None

    # methods, not properties: Dynamo traces a NamedTuple's methods (the plugin's GEMMs run
    # under vLLM's torch.compile)
    def is_grouped(self) -> bool:
        return self.offsets is not None

    def op_name(self) -> str:
        base = "nvfp4_grouped_mm" if self.offsets is not None else "nvfp4_linear"
        return base + ("_quantized" if self.x_operands is not None else "")

    def overload(self):
        """The op overload this call runs (`torch.ops.fp4_compile.<op_name()>.default`)."""
        return getattr(_ops(), self.op_name()).default

    def named_args(self) -> dict[str, Any]:
        """{schema argument name: value}, validated."""
        if self.is_grouped() and self.bias is not None:
            raise ValueError("bias is not an argument of the grouped GEMM (offsets given)")
        if not self.is_grouped() and (self.x_index is not None or self.x_perm is not None):
            raise ValueError("x_index / x_perm belong to the grouped GEMM: give offsets")
        if self.x_perm is not None and self.x_index is None:
            raise ValueError("x_perm needs x_index (it describes the gather)")
        w = QuantizedWeight.of(self.w)
        out = {
            "x": self.x,
            "weight": self.weight,
            "w_codes": w.codes,
            "w_scales": w.scales,
            "w_global_decode": w.global_decode,
            "bias": self.bias,
            "offsets": self.offsets,
            "x_amax": self.x_amax,
            "recipe": encode_recipe(self.recipe),
            "w_ongrid": self.w_ongrid,
            "site": self.site,
            "x_index": self.x_index,
            "x_perm": self.x_perm,
        }
        ops = self.x_operands
        if ops is not None:
            if not isinstance(ops, ActivationOperands):
                raise TypeError(f"x_operands must be ActivationOperands, got {type(ops)}")
            out.update(x_ongrid=ops.ongrid, x_gd=ops.global_decode)
            if self.is_grouped() and (ops.t_ongrid is not None or ops.t_global_decode is not None):
                raise ValueError("the grouped GEMM takes no X^T operand (t_ongrid)")
            if not self.is_grouped():
                if ops.t_ongrid is None or ops.t_global_decode is None:
                    raise ValueError("the dense quantized GEMM needs X^T's operand ([0] if none)")
                out.update(xt_ongrid=ops.t_ongrid, xt_gd=ops.t_global_decode)
        return out

    def args(self) -> tuple:
        """The op's positional arguments. nvfp4_linear / nvfp4_grouped_mm: through `site`,
        then x_index and x_perm only as far as given (the nodes the lowering has always
        emitted); the `_quantized` ops: all of them."""
        values = self.named_args()
        names = OP_ARGS[self.op_name()]
        if self.x_operands is None and self.is_grouped():
            names = names[: 10 + (self.x_index is not None) + (self.x_perm is not None)]
        return tuple(values[n] for n in names)

    def run(self) -> torch.Tensor:
        """Call the op (eagerly, or traced by Dynamo)."""
        return self.overload()(*self.args())

    def weight_operand(self) -> QuantizedWeight:
        return QuantizedWeight.of(self.w)

    @classmethod
    def from_args(cls, op_name: str, args: tuple, kwargs: dict | None = None) -> GemmCall:
        """The call of op `op_name` with these positional (and keyword) arguments, defaults
        filled, the recipe decoded."""
        names = OP_ARGS[op_name]
        if len(args) > len(names):
            raise ValueError(f"{op_name} takes {len(names)} arguments, got {len(args)}")
        values = dict(zip(names, args))
        for key, value in (kwargs or {}).items():
            if key not in names or key in values:
                raise ValueError(f"{op_name}: unexpected or repeated argument {key!r}")
            values[key] = value
        for name in names:
            if name not in values:
                if name not in DEFAULTS or op_name.endswith("_quantized"):
                    raise ValueError(f"{op_name}: argument {name!r} is missing")
                values[name] = DEFAULTS[name]
        operands = None
        if op_name.endswith("_quantized"):
            operands = ActivationOperands(
                values["x_ongrid"], values["x_gd"], values.get("xt_ongrid"), values.get("xt_gd")
            )
        return cls(
            x=values["x"],
            weight=values["weight"],
            w=QuantizedWeight(values["w_codes"], values["w_scales"], values["w_global_decode"]),
            recipe=decode_recipe(values["recipe"]),
            bias=values.get("bias"),
            offsets=values.get("offsets"),
            x_amax=values["x_amax"],
            w_ongrid=values["w_ongrid"],
            site=values["site"],
            x_index=values.get("x_index"),
            x_perm=values.get("x_perm"),
            x_operands=operands,
        )

    @classmethod
    def of(cls, node) -> GemmCall:
        """The call an fx node of a GEMM op makes (its fields: the argument nodes/values)."""
        name = gemm_op_name(getattr(node, "target", None))
        if getattr(node, "op", None) != "call_function" or name is None:
            raise ValueError(f"{node} is not a call of an NVFP4 GEMM op ({GEMM_OPS})")
        return cls.from_args(name, tuple(node.args), dict(node.kwargs))


def register_gemm(op_name: str, forward, fake, *, setup_context, backward):
    """Register GEMM op `fp4_compile::<op_name>` from the table: its schema (`op_schema`), its
    device implementation `forward(call)` and fake `fake(call)`, both handed the `GemmCall`
    (recipe decoded once, `decode_recipe`), and its autograd formula. Returns the op."""

    def run(*args, **kwargs):
        return forward(GemmCall.from_args(op_name, args, kwargs))

    def run_fake(*args, **kwargs):
        return fake(GemmCall.from_args(op_name, args, kwargs))

    run.__name__ = run_fake.__name__ = op_name
    op = torch.library.custom_op(
        f"fp4_compile::{op_name}", run, mutates_args=(), schema=op_schema(op_name)
    )
    op.register_fake(run_fake)
    op.register_autograd(backward, setup_context=setup_context)
    return op


def op_inputs(op_name: str, inputs: tuple) -> dict[str, Any]:
    """{argument name: value} of an op's inputs (autograd's `setup_context`), raw: the recipe
    stays encoded."""
    return dict(zip(OP_ARGS[op_name], inputs))


def input_grads(op_name: str, **grads) -> tuple:
    """Autograd's gradient tuple of op `op_name`: the named gradients, None elsewhere."""
    names = OP_ARGS[op_name]
    unknown = set(grads) - set(names)
    if unknown:
        raise ValueError(f"{op_name} has no arguments {sorted(unknown)}")
    return tuple(grads.get(n) for n in names)


def needs_input_grad(op_name: str, flags) -> dict[str, bool]:
    """{argument name: whether autograd needs its gradient} from `ctx.needs_input_grad`."""
    return dict(zip(OP_ARGS[op_name], flags))
