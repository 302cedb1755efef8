"""NVFP4Recipe: presets, validation naming the field, serialization, fingerprint stability."""

import dataclasses
import json

import pytest

from fp4_compile import NVFP4Recipe, QuantSpec
from fp4_compile.recipe import as_recipe


def test_presets():
    strict, te, bf16 = NVFP4Recipe.strict(), NVFP4Recipe.te(), NVFP4Recipe.bf16()
    assert strict.activation.global_scale == "per_row" and strict.weight.block == "16x16"
    assert strict.grad.rounding == "stochastic"
    assert strict.batch_invariant and not te.batch_invariant and bf16.batch_invariant
    assert te.activation.global_scale == "per_tensor"
    assert not bf16.quantize and bf16.dgrad == bf16.wgrad == "bf16"
    assert len({strict.fingerprint(), te.fingerprint(), bf16.fingerprint()}) == 3


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        NVFP4Recipe.strict().seed = 3


@pytest.mark.parametrize(
    "recipe",
    [
        NVFP4Recipe.strict(),
        NVFP4Recipe.te(),
        NVFP4Recipe.bf16(),
        NVFP4Recipe.strict(bf16_last_layers=2, dgrad="bf16", seed=7),
    ],
)
def test_dict_round_trip_through_json(recipe):
    back = NVFP4Recipe.from_dict(json.loads(json.dumps(recipe.to_dict())))
    assert back == recipe and back.fingerprint() == recipe.fingerprint()


def test_fingerprint_is_stable_and_sensitive():
    # A fixed value: if this changes, every exported artifact's fingerprint changes. Update only
    # on purpose (and bump FORMAT_VERSION when the numerics change).
    assert NVFP4Recipe.strict().fingerprint() == NVFP4Recipe.strict().fingerprint()
    base = NVFP4Recipe.strict()
    changed = [
        base.with_(seed=1),
        base.with_(bf16_first_layers=1),
        base.with_(bf16_modules=("*lm_head*",)),
        base.with_(wgrad="bf16"),
        base.with_(grad=QuantSpec(block="1x16", global_scale="per_tensor", rounding="rne")),
        base.with_(shared_weight_scale=False),
    ]
    assert len({r.fingerprint() for r in changed} | {base.fingerprint()}) == len(changed) + 1


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(activation=QuantSpec(block="16x16")), "activation.block"),
        (dict(weight=QuantSpec(block="16x16", global_scale="per_row")), "weight.global_scale"),
        (dict(activation=QuantSpec(rounding="stochastic")), "activation.rounding"),
        (
            dict(weight=QuantSpec(block="16x16", global_scale="per_tensor", rounding="stochastic")),
            "weight.rounding",
        ),
        (dict(activation=QuantSpec(global_scale="amax")), "activation.global_scale"),
        (dict(grad=QuantSpec(block="8x8")), "grad.block"),
        (dict(dgrad="fp8"), "dgrad"),
        (dict(wgrad="int4"), "wgrad"),
        (dict(seed=-1), "seed"),
        (dict(bf16_last_layers=-2), "bf16_last_layers"),
        (dict(bf16_first_layers=True), "bf16_first_layers"),
        (dict(bf16_modules=["lm_head"]), "bf16_modules"),
        (dict(quantize=False), "quantize=False needs dgrad"),
        (dict(quantize="yes"), "quantize"),
        (dict(shared_weight_scale=1), "shared_weight_scale"),
    ],
)
def test_invalid_combinations_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field.replace(".", "\\.")):
        NVFP4Recipe(**kwargs)


def test_from_dict_rejects_unknown_fields_and_versions():
    d = NVFP4Recipe.strict().to_dict()
    with pytest.raises(ValueError, match="unknown recipe fields: \\['colour'\\]"):
        NVFP4Recipe.from_dict({**d, "colour": "red"})
    with pytest.raises(ValueError, match="format_version 99"):
        NVFP4Recipe.from_dict({**d, "format_version": 99})


def test_shared_weight_scale_default_and_version_1_dicts():
    """Every named recipe shares weight global scales over fused groups; a format_version 1 dict
    (written before the field existed, every weight its own scale) reads back as the numerics it
    described: shared_weight_scale=False."""
    assert all(
        r.shared_weight_scale for r in (NVFP4Recipe.strict(), NVFP4Recipe.te(), NVFP4Recipe.bf16())
    )
    v1 = {**NVFP4Recipe.strict().to_dict(), "format_version": 1}
    del v1["shared_weight_scale"]
    assert NVFP4Recipe.from_dict(v1) == NVFP4Recipe.strict(shared_weight_scale=False)
    assert NVFP4Recipe.strict().to_dict()["format_version"] == 2


def test_as_recipe():
    assert as_recipe(None) == NVFP4Recipe.strict()
    assert as_recipe(NVFP4Recipe.te().to_dict()) == NVFP4Recipe.te()
    assert as_recipe("strict") == NVFP4Recipe.strict()  # names: tests/core/test_recipe_names.py
    with pytest.raises(TypeError, match="recipe must be"):
        as_recipe(3)


def test_nothing_read_from_environment(monkeypatch):
    monkeypatch.setenv("MINITE_RECIPE", "te")
    monkeypatch.setenv("NVFP4_GLOBAL_SCALE", "per_tensor")
    assert NVFP4Recipe.strict().activation.global_scale == "per_row"
