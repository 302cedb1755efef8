"""The `minite` torch.compile backend (entry point `torch_dynamo_backends: minite`).

Thin by design: parse the recipe, run the pass pipeline (fp4_compile.passes) on the Dynamo graph,
hand the result to Inductor with the settings that would break batch invariance pinned for the
duration of the compile. Inductor's aot_autograd then derives the backward from the lowered ops'
registered autograd, so forward and backward come from the same lowering. The pinned settings
themselves: `compiler_pins.py` (the rollout export's AOTInductor package takes the same).
"""

from __future__ import annotations

import hashlib
import inspect
from pathlib import Path

import torch

from . import codegen, passes
from .codegen.nvfp4.gemm_call import GemmCall, is_gemm
from .compiler_pins import aoti_inductor_configs, deterministic_lowering, pinned_matmul_precision
from .passes import run_pipeline
from .recipe import NVFP4Recipe, as_recipe
from .sr_stream import prepare_device_counters, site_seed

_KNOWN_OPTIONS = (
    "recipe",
    "report_sink",
    "cuda_graphs",
    "save_ongrid_weights",
    "fuse_quantize",
    "weight_store",
)


def options_error(error: TypeError | ValueError, frame=None) -> Exception:
    """`error` (a bad `options` value, from `parse_options`) as the exception the backend raises:
    an instance of its own type (ValueError / TypeError, same message) that is also Dynamo's
    `ShortenTraceback`, the one kind of backend error Dynamo re-raises as is instead of wrapping
    it in `BackendCompilerFailed` (torch._dynamo.output_graph `call_user_compiler`). So
    `torch.compile(model, backend="minite", options={"recipe": "bogus"})(x)` raises a ValueError
    naming options['recipe'], its traceback cut to start at `frame` (the backend's: no Dynamo
    frames). torch.compile calls no backend code before the first call, so that call is the
    earliest point a bad option can be refused."""
    from torch._dynamo.exc import ShortenTraceback  # lazy: Dynamo costs seconds at import

    kind = type(error)
    bad_options = type(f"Minite{kind.__name__}", (ShortenTraceback, kind), {})
    return bad_options(str(error), first_useful_frame=frame)


def parse_options(options) -> tuple[NVFP4Recipe, dict]:
    """(recipe, options) of the backend's `options` dict; a TypeError / ValueError naming the
    option for a bad one."""
    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise TypeError(
            f"options must be a dict like {{'recipe': NVFP4Recipe.strict()}}, got {type(options).__name__}"
        )
    unknown = sorted(set(options) - set(_KNOWN_OPTIONS))
    if unknown:
        raise ValueError(f"unknown minite backend options {unknown}; known: {list(_KNOWN_OPTIONS)}")
    for name in ("cuda_graphs", "save_ongrid_weights", "fuse_quantize"):
        if not isinstance(options.get(name, False), bool):
            raise TypeError(f"options[{name!r}] must be a bool, got {options[name]!r}")
    try:
        recipe = as_recipe(options.get("recipe"))
    except (TypeError, ValueError) as e:
        raise type(e)(f"options['recipe']: {e}") from None
    return recipe, options


def _cuda_device(example_inputs) -> torch.device:
    for t in example_inputs:
        if isinstance(t, torch.Tensor) and t.device.type == "cuda":
            return t.device
    raise ValueError(
        "options['cuda_graphs']=True needs a model on a CUDA device (CUDA graphs are CUDA-only); "
        "the example inputs hold no CUDA tensor"
    )


def prepare_graph_seeds(gm: torch.fx.GraphModule, device: torch.device) -> int:
    """Make the device stochastic-rounding counter of every NVFP4 GEMM site of the lowered graph
    (their backward draws its seeds from it inside a CUDA-graph capture, `sr_stream`); returns
    how many sites."""
    calls = [GemmCall.of(n) for n in gm.graph.nodes if is_gemm(n)]
    keys = {site_seed(call.recipe.seed, call.site) for call in calls}
    prepare_device_counters(sorted(keys), device)
    return len(keys)


def _pass_sources_digest() -> str:
    """Hash of the source of every pass and of the core numerics: part of the cache key."""
    h = hashlib.sha256()
    folders = [Path(m.__file__).resolve().parent for m in (passes, codegen)]
    for folder in [Path(__file__).resolve().parent, *folders]:
        for path in sorted(folder.rglob("*.py")):
            h.update(path.relative_to(folder).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _cache_key_pass(recipe: NVFP4Recipe):
    from torch._inductor.custom_graph_pass import CustomGraphPass  # lazy: Inductor, as above

    class MiniteCacheKey(CustomGraphPass):
        """No-op post-grad pass whose uuid puts the recipe fingerprint and the pass sources into
        Inductor's cache key."""

        def __call__(self, graph) -> None:
            return None

        def uuid(self) -> bytes:
            return f"minite:{recipe.fingerprint()}:{_pass_sources_digest()}".encode()

    return MiniteCacheKey()


def inductor_patches(recipe: NVFP4Recipe) -> dict:
    patches = aoti_inductor_configs()
    patches["post_grad_custom_post_pass"] = _cache_key_pass(recipe)
    return patches


def minite_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, **unused):
    """torch.compile(model, backend="minite", options={"recipe": NVFP4Recipe.strict()}).

    options["cuda_graphs"] = True (CUDA only): Inductor replays the forward and the backward
    as CUDA graphs (no host launches per op; the same kernels, the same bits); stochastic
    rounding keeps drawing fresh seeds per call from device-side counters. The lowered CUDA
    path must read no device data on the host (the MoE backward's per-expert loops of the
    bf16 dgrad / wgrad settings do: capture fails there, loudly).

    options["save_ongrid_weights"] (default True): where the forward runs the on-grid GEMM
    (CUDA, >= `codegen.nvfp4.gemm.ONGRID_FORWARD_MIN_ROWS` rows per weight), each weight is dequantized
    ONCE per step and autograd keeps that copy for the dgrad: faster, at the memory of one
    BF16-size copy of each such weight from its forward to its backward. False: the forward and
    the dgrad each dequantize (no copy kept). The same bits either way.

    options["weight_store"] (a `rollout.weight_store.WeightStore`: a rollout engine's, or the
    learner's from `fp4_compile.compile(..., quantize_weights="on_change")`): the graph reads its
    weights' quantized bytes from the store (extra inputs the compiled function appends to every
    call, static for CUDA graphs) instead of quantizing them per call
    (`passes/bind_weight_inputs.py`), a learner's store its on-grid copies too; a store made with
    on_change=True re-quantizes before a call when a weight changed in place. The same bits.

    options["fuse_quantize"] (default True): activations are quantized once per distinct input
    and, where minite owns the producer (RMSNorm, SwiGLU), by the producer's kernel
    (`passes.QUANTIZE_FUSIONS`). False: every GEMM quantizes its own operand (the A/B of the
    fusions). The same bits either way."""
    from torch._inductor.compile_fx import compile_fx  # lazy: Inductor, as above

    try:
        recipe, opts = parse_options(options)
        device = _cuda_device(example_inputs) if opts.get("cuda_graphs") else None
    except (TypeError, ValueError) as e:
        raise options_error(e, inspect.currentframe()) from None
    report = run_pipeline(
        gm,
        recipe,
        save_ongrid_weights=opts.get("save_ongrid_weights", True),
        fuse_quantize=opts.get("fuse_quantize", True),
    )
    sink = opts.get("report_sink")
    if sink is not None:
        sink.append(report)
    store, extra = opts.get("weight_store"), ()
    if store is not None:
        gm, example_inputs, extra = store.bind_dynamo_graph(gm, example_inputs, report)
    patches = inductor_patches(recipe)
    if device is not None:
        # Inductor's CUDA graphs (what mode="reduce-overhead" turns on): the forward and the
        # backward each replay as one graph launch. The backward's SR seeds then come from device
        # counters, made here, outside any capture.
        prepare_graph_seeds(gm, device)
        patches["triton.cudagraphs"] = True
    with pinned_matmul_precision(), deterministic_lowering():
        compiled = compile_fx(gm, example_inputs, config_patches=patches)
    if not extra:
        return compiled

    def with_store_inputs(*args):
        if store.on_change:
            store.refresh_if_changed()
        return compiled(*args, *extra)

    return with_store_inputs


def lowering_only_backend(recipe: NVFP4Recipe, sink: list | None = None):
    """A backend that runs the pass pipeline and then executes the lowered FX graph eagerly
    (no Inductor): the reference path of the lowering, used by `explain` and the tests."""

    def backend(gm, example_inputs, **unused):
        report = run_pipeline(gm, recipe)
        if sink is not None:
            sink.append(report)
        return gm.forward

    return backend
