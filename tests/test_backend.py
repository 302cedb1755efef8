"""The `minite` backend's own contract: options are validated, the invariance settings are pinned
only while compiling (and restored), the compile cache key carries the recipe fingerprint and
the pass sources, and the Inductor eager-numerics knobs are set where this torch has them."""

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile.backend import (
    EAGER_NUMERICS_KNOBS,
    INVARIANCE_INDUCTOR_CONFIG,
    aoti_inductor_configs,
    deterministic_lowering,
    inductor_patches,
    numerics_knobs,
    parse_options,
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


def test_compile_leaves_inductor_config_as_it_was():
    from torch._inductor import config

    before = (config.split_reductions, config.emulate_precision_casts)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
    torch._dynamo.reset()
    out = torch.compile(model, backend="minite", fullgraph=True)(torch.randn(4, 32))
    assert out.shape == (4, 16)
    assert (config.split_reductions, config.emulate_precision_casts) == before
