"""The `minite` backend's own contract: options are validated, the invariance settings are pinned
only while compiling (and restored), the compile cache key carries the recipe fingerprint and
the pass sources, and the Inductor eager-numerics knobs are set where this torch has them."""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.backend import inductor_patches, parse_options
from fp4_compile.compiler_pins import (
    EAGER_NUMERICS_KNOBS,
    INVARIANCE_INDUCTOR_CONFIG,
    aoti_inductor_configs,
    deterministic_lowering,
    numerics_knobs,
    pinned_matmul_precision,
)


def test_options_are_validated():
    recipe, _ = parse_options({"recipe": NVFP4Recipe.te()})
    assert recipe == NVFP4Recipe.te()
    assert parse_options(None)[0] == NVFP4Recipe.strict()  # the default recipe
    with pytest.raises(TypeError, match="options must be a dict"):
        parse_options("strict")
    with pytest.raises(ValueError, match="unknown minite backend options"):
        parse_options({"recipe": None, "recpie": 1})


def test_matmul_precision_is_pinned_then_restored():
    cuda_matmul = torch.backends.cuda.matmul
    saved = cuda_matmul.allow_tf32, cuda_matmul.allow_bf16_reduced_precision_reduction
    try:
        cuda_matmul.allow_tf32 = True
        cuda_matmul.allow_bf16_reduced_precision_reduction = True
        with pinned_matmul_precision():
            assert not cuda_matmul.allow_tf32
            assert not cuda_matmul.allow_bf16_reduced_precision_reduction
        assert cuda_matmul.allow_tf32 and cuda_matmul.allow_bf16_reduced_precision_reduction
    finally:
        cuda_matmul.allow_tf32, cuda_matmul.allow_bf16_reduced_precision_reduction = saved


def test_deterministic_flag_only_while_lowering():
    before = torch.are_deterministic_algorithms_enabled()
    with deterministic_lowering():
        assert torch.are_deterministic_algorithms_enabled()
    assert torch.are_deterministic_algorithms_enabled() == before


def test_inductor_patches_pin_invariance_and_key_the_cache():
    strict, te = inductor_patches(NVFP4Recipe.strict()), inductor_patches(NVFP4Recipe.te())
    for key, value in INVARIANCE_INDUCTOR_CONFIG.items():
        assert strict[key] == value
    assert strict["split_reductions"] is False and strict["emulate_precision_casts"] is True
    present = numerics_knobs()
    assert set(present) == set(EAGER_NUMERICS_KNOBS)
    for key, has in present.items():
        assert (key in strict) == has and (key in aoti_inductor_configs()) == has
    # this torch (2.13) has all of them; the H200's 2.11 lacks use_pytorch_libdevice
    assert present["eager_numerics.division_rounding"]
    uuid_strict = strict["post_grad_custom_post_pass"].uuid()
    uuid_te = te["post_grad_custom_post_pass"].uuid()
    assert NVFP4Recipe.strict().fingerprint().encode() in uuid_strict and uuid_strict != uuid_te


def test_cpu_code_is_not_contracted_whatever_the_environment_says():
    """A user's TORCHINDUCTOR_CPP_ENABLE_FLOATING_POINT_CONTRACT_FLAG=fast lets the C++ compiler
    fuse a*b+c into an FMA (942 of these 4096 values change); the backend pins it off."""
    from torch._inductor import config

    torch.manual_seed(0)
    a, b, c = (torch.randn(4096) for _ in range(3))
    with config.patch(
        {"cpp.enable_floating_point_contract_flag": "fast", "force_disable_caches": True}
    ):
        torch._dynamo.reset()
        contracted = torch.compile(lambda a, b, c: a * b + c, backend="inductor")(a, b, c)
        torch._dynamo.reset()
        got = torch.compile(lambda a, b, c: a * b + c, backend="minite")(a, b, c)
    torch._dynamo.reset()
    if torch.equal(contracted, a * b + c):
        pytest.skip("this machine's C++ compiler does not contract a*b+c (no FMA)")
    assert torch.equal(got, a * b + c)


def test_compile_leaves_inductor_config_as_it_was():
    from torch._inductor import config

    before = (config.split_reductions, config.emulate_precision_casts)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    torch._dynamo.reset()
    out = torch.compile(model, backend="minite", fullgraph=True)(torch.randn(4, 32))
    assert out.shape == (4, 16)
    assert (config.split_reductions, config.emulate_precision_casts) == before


@pytest.mark.parametrize(
    "options, error, match",
    [
        ({"recipe": "bogus"}, ValueError, r"options\['recipe'\]: recipe must be one of"),
        ({"recipe": 3}, TypeError, r"options\['recipe'\]: recipe must be an NVFP4Recipe"),
        ({"recpie": "strict"}, ValueError, "unknown minite backend options"),
    ],
)
def test_bad_options_raise_their_own_error_through_torch_compile(options, error, match):
    """torch.compile(backend="minite", options=...) with a bad option: the first call raises the
    backend's own ValueError / TypeError naming the option, not Dynamo's BackendCompilerFailed
    wrapper, and its traceback holds no Dynamo compiler frames."""
    import traceback

    model = torch.nn.Sequential(torch.nn.Linear(32, 16))
    torch._dynamo.reset()
    try:
        compiled = torch.compile(model, backend="minite", options=options)
        with pytest.raises(error, match=match) as info:
            compiled(torch.randn(4, 32))
    finally:
        torch._dynamo.reset()
    assert not isinstance(info.value, torch._dynamo.exc.BackendCompilerFailed)
    frames = traceback.extract_tb(info.value.__traceback__)
    assert not any("output_graph.py" in f.filename for f in frames), frames
    assert frames[-1].name == "minite_backend", frames[-1]


def test_recipe_names_are_accepted_as_options():
    """options={"recipe": "te"} is the te preset (names work wherever a recipe does)."""
    assert parse_options({"recipe": "te"})[0] == NVFP4Recipe.te()


def test_cuda_graphs_option_is_validated_and_cuda_only():
    """options['cuda_graphs'] must be a bool; on a CPU model it is refused, naming the option
    (no silent run without graphs)."""
    with pytest.raises(TypeError, match="cuda_graphs"):
        parse_options({"cuda_graphs": "yes"})
    assert parse_options({"cuda_graphs": True})[1]["cuda_graphs"] is True
    model = torch.nn.Sequential(torch.nn.Linear(32, 16))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="minite", options={"cuda_graphs": True})
    with pytest.raises(Exception, match="cuda_graphs"):
        compiled(torch.randn(4, 32))
    torch._dynamo.reset()


def test_graph_seed_counters_cover_every_nvfp4_site(monkeypatch):
    """prepare_graph_seeds makes one device SR counter per NVFP4 GEMM site of the lowered graph
    (the keys the backward draws with), for linears and MoE experts alike."""
    from fp4_compile import sr_stream
    from fp4_compile.backend import prepare_graph_seeds
    from fp4_compile.codegen.nvfp4.gemm_call import GemmCall
    from fp4_compile.models import tiny_qwen3_moe
    from fp4_compile.passes import run_pipeline

    monkeypatch.setattr(sr_stream, "_device_counters", {})
    recipe = NVFP4Recipe.strict(seed=11)
    seen = {}

    def backend(gm, example_inputs, **_):
        run_pipeline(gm, recipe)
        seen["n"] = prepare_graph_seeds(gm, torch.device("cpu"))
        ops = torch.ops.fp4_compile
        grouped = (ops.nvfp4_grouped_mm.default, ops.nvfp4_grouped_mm_quantized.default)
        gemms = (ops.nvfp4_linear.default, ops.nvfp4_linear_quantized.default, *grouped)
        seen["sites"] = {
            sr_stream.site_seed(GemmCall.of(n).recipe.seed, GemmCall.of(n).site)
            for n in gm.graph.nodes
            if n.target in gemms
        }
        seen["grouped"] = sum(n.target in grouped for n in gm.graph.nodes)
        return gm.forward

    model = tiny_qwen3_moe(layers=1)
    torch._dynamo.reset()
    torch.compile(model, backend=backend, fullgraph=True)(
        input_ids=torch.randint(0, 64, (1, 8)), use_cache=False
    )
    torch._dynamo.reset()
    assert seen["grouped"] > 0 and seen["n"] == len(seen["sites"]) > seen["grouped"]
    assert {k for k, _ in sr_stream._device_counters} == seen["sites"]
    assert all(int(c) == 0 for c in sr_stream._device_counters.values())
