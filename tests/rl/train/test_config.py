"""TrainConfig and the named presets: validation names the setting, key=value parsing is typed,
variants select the recipe presets."""

import pytest

from fp4_compile import NVFP4Recipe
from fp4_compile.rl.train.config import TrainConfig
from fp4_compile.rl.train.presets import PRESETS, get_preset


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("variant", ["strict", "te", "bf16"])
def test_presets_build(name, variant):
    cfg = get_preset(name, variant)
    assert cfg.variant == variant and cfg.out_dir == f"runs/{name}-{variant}"
    preset = {"strict": NVFP4Recipe.strict, "te": NVFP4Recipe.te, "bf16": NVFP4Recipe.bf16}[
        variant
    ]()
    assert cfg.recipe().fingerprint() == preset.fingerprint()
    assert (cfg.tis_cap == 2.0) == (variant == "te")
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg


def test_overrides_are_typed():
    cfg = get_preset("tiny").with_overrides(
        [
            "steps=7",
            "lr=1e-4",
            "compile=false",
            "tis_cap=none",
            "mis_seq_bounds=0.5,2",
            "aggregation=sequence",
        ]
    )
    assert (cfg.steps, cfg.lr, cfg.compile, cfg.tis_cap) == (7, 1e-4, False, None)
    assert cfg.mis_seq_bounds == (0.5, 2.0) and cfg.aggregation == "sequence"


@pytest.mark.parametrize(
    "pair, match",
    [
        ("stepz=3", "unknown setting 'stepz'"),
        ("steps", "key=value"),
        ("steps=abc", "steps='abc'"),
        ("compile=maybe", "compile='maybe'"),
        ("steps=0", "steps must be >= 1"),
        ("aggregation=batch", "aggregation must be one of"),
        ("group_size=1", "group_size must be >= 2"),
        ("variant=fp8", "variant must be one of"),
        ("rollout_cuda_graphs=true", "rollout_cuda_graphs=True needs a CUDA device"),
    ],
)
def test_override_errors_name_the_setting(pair, match):
    with pytest.raises(ValueError, match=match):
        get_preset("tiny").with_overrides([pair])


def test_unknown_recipe_and_variant():
    with pytest.raises(ValueError, match="preset must be one of"):
        get_preset("huge")
    with pytest.raises(ValueError, match="variant must be one of"):
        get_preset("tiny", "fp8")


def test_type_checks():
    with pytest.raises(ValueError, match="steps must be"):
        TrainConfig(steps=2.5)
    with pytest.raises(ValueError, match="compile must be"):
        TrainConfig(compile="yes")
