"""The `minite` torch.compile backend (entry point `torch_dynamo_backends: minite`).

Thin by design: parse the recipe, run the pass pipeline (fp4_compile.passes) on the Dynamo graph,
hand the result to Inductor with the settings that would break batch invariance pinned for the
duration of the compile. Inductor's aot_autograd then derives the backward from the lowered ops'
registered autograd, so forward and backward come from the same lowering.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
from collections.abc import Iterator
from pathlib import Path

import torch

from .recipe import NVFP4Recipe, as_recipe

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
    from torch._dynamo.exc import ShortenTraceback

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
    from .codegen.nvfp4.gemm_call import GemmCall, is_gemm
    from .sr_stream import prepare_device_counters, site_seed

    calls = [GemmCall.of(n) for n in gm.graph.nodes if is_gemm(n)]
    keys = {site_seed(call.recipe.seed, call.site) for call in calls}
    prepare_device_counters(sorted(keys), device)
    return len(keys)


def _pass_sources_digest() -> str:
    """Hash of the source of every pass and of the core numerics: part of the cache key."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    folders = [root, root.parent / "passes", root.parent / "codegen"]
    try:
        from . import passes as _passes

        folders[1] = Path(_passes.__file__).resolve().parent
        from . import codegen as _codegen

        folders[2] = Path(_codegen.__file__).resolve().parent
    except ImportError:  # pragma: no cover
        pass
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            h.update(path.relative_to(folder).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _cache_key_pass(recipe: NVFP4Recipe):
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class MiniteCacheKey(CustomGraphPass):
        """No-op post-grad pass whose uuid puts the recipe fingerprint and the pass sources into
        Inductor's cache key."""

        def __call__(self, graph) -> None:
            return None

        def uuid(self) -> bytes:
            return f"minite:{recipe.fingerprint()}:{_pass_sources_digest()}".encode()

    return MiniteCacheKey()


INVARIANCE_INDUCTOR_CONFIG = {
    "split_reductions": False,  # a split reduction's order depends on the reduction size
    "max_autotune": False,  # no runtime autotuning / template selection
    "max_autotune_gemm": False,
    "max_autotune_pointwise": False,
    "coordinate_descent_tuning": False,
    "force_disable_caches": False,
    # Round every op's output to its dtype as eager does and keep Triton from contracting a*b+c
    # into an FMA across ops: otherwise a value's bits may depend on which ops Inductor fused,
    # and the learner's graph and the rollout's prefill/decode graphs fuse differently. (On the
    # H200 this alone did not explain the strict gap: benchmarks/results/*localize_h200*.)
    "emulate_precision_casts": True,
}


# Eager numerics of the traced elementwise ops (SiLU, residual adds, rotary, casts) on the GPU:
# Triton lowers x / y to the approximate `div.full` where eager CUDA rounds (`div.rn`), and may
# flush denormals; then an FP32 model's backward differs from the same graph run eagerly by an
# ulp here and there (tiny Llama FP32 on the H200: 3-4 of 12 gradients in
# benchmarks/results/2026-12-04_backend_gpu_check_c695808.md, the before_stable_sort section;
# 0 with these knobs).
# Older Inductors lack some of them (torch 2.11: no use_pytorch_libdevice): `numerics_knobs()`
# says which this torch has, and the GPU checks print it.
EAGER_NUMERICS_KNOBS = {
    "eager_numerics.division_rounding": True,
    "eager_numerics.disable_ftz": True,
    "eager_numerics.use_pytorch_libdevice": True,
}


# Inductor's C++ (CPU) code: no a*b+c contracted into an FMA and no unsafe math, whatever the
# environment says (DESIGN: nothing that changes numerics is read from environment variables;
# TORCHINDUCTOR_CPP_ENABLE_FLOATING_POINT_CONTRACT_FLAG=fast changes 942 of 4096 values of a*b+c
# here, and a learner graph and a rollout graph fuse differently).
CPU_CODEGEN_PINS = {
    "cpp.enable_floating_point_contract_flag": "off",
    "cpp.enable_unsafe_math_opt_flag": False,
}


def _has_config(key: str) -> bool:
    from torch._inductor import config

    node = config
    for part in key.split("."):
        if not hasattr(node, part):
            return False
        node = getattr(node, part)
    return True


def numerics_knobs() -> dict:
    """{knob: True if this torch's Inductor has it (and minite sets it), else False}."""
    return {key: _has_config(key) for key in EAGER_NUMERICS_KNOBS}


def inductor_patches(recipe: NVFP4Recipe) -> dict:
    patches = dict(INVARIANCE_INDUCTOR_CONFIG)
    patches.update({k: v for k, v in EAGER_NUMERICS_KNOBS.items() if _has_config(k)})
    patches.update({k: v for k, v in CPU_CODEGEN_PINS.items() if _has_config(k)})
    patches["post_grad_custom_post_pass"] = _cache_key_pass(recipe)
    return patches


def aoti_inductor_configs() -> dict:
    """The same pinned settings for AOTInductor packages (`aoti_compile_and_package`), so an
    exported rollout's traced ops round like the learner's."""
    configs = dict(INVARIANCE_INDUCTOR_CONFIG)
    configs.update({k: v for k, v in EAGER_NUMERICS_KNOBS.items() if _has_config(k)})
    configs.update({k: v for k, v in CPU_CODEGEN_PINS.items() if _has_config(k)})
    return configs


@contextlib.contextmanager
def pinned_matmul_precision() -> Iterator[None]:
    """Pin the global matmul-precision flags (no TF32, no reduced-precision reductions) while
    compiling; restore them afterwards."""
    cuda_matmul = torch.backends.cuda.matmul
    saved = (
        cuda_matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        cuda_matmul.allow_bf16_reduced_precision_reduction,
        cuda_matmul.allow_fp16_reduced_precision_reduction,
    )
    try:
        cuda_matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        cuda_matmul.allow_bf16_reduced_precision_reduction = False
        cuda_matmul.allow_fp16_reduced_precision_reduction = False
        yield
    finally:
        (
            cuda_matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            cuda_matmul.allow_bf16_reduced_precision_reduction,
            cuda_matmul.allow_fp16_reduced_precision_reduction,
        ) = saved


@contextlib.contextmanager
def deterministic_lowering() -> Iterator[None]:
    """Compile forward AND backward now with torch's deterministic-algorithms flag on (warn
    only), restored afterwards. Inductor lowers accumulating scatters (`index_put` with
    accumulate: the backward of the embedding and of the MoE token gather) to atomic adds on the
    GPU, whose order changes from run to run; with the flag on it calls ATen's sorted,
    deterministic kernels instead. The backward is lowered here, not lazily at the first
    backward call, so that the flag is on while it is."""
    from torch._functorch import config as functorch_config

    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    eager_bwd = (
        functorch_config.patch(force_non_lazy_backward_lowering=True)
        if hasattr(functorch_config, "force_non_lazy_backward_lowering")
        else contextlib.nullcontext()
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with eager_bwd:
            yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])


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
    from torch._inductor.compile_fx import compile_fx

    from .passes import run_pipeline

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
        gm, example_inputs, extra = store.bind_dynamo_graph(gm, example_inputs)
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
    from .passes import run_pipeline

    def backend(gm, example_inputs, **unused):
        report = run_pipeline(gm, recipe)
        if sink is not None:
            sink.append(report)
        return gm.forward

    return backend
