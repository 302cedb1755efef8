"""A recipe is accepted by its preset name wherever a recipe is (Python API, backend options, CLI
variants): the name gives exactly the preset's recipe; an unknown name is an error naming it."""

import pytest
import torch

import fp4_compile
from fp4_compile import NVFP4Recipe
from fp4_compile.recipe import as_recipe


@pytest.mark.parametrize("name", ["strict", "te", "bf16"])
def test_name_gives_the_preset(name):
    assert as_recipe(name).fingerprint() == getattr(NVFP4Recipe, name)().fingerprint()


def test_unknown_name_is_named():
    with pytest.raises(ValueError, match="got 'fp8'"):
        as_recipe("fp8")
    with pytest.raises(ValueError, match="got 'fp8'"):
        fp4_compile.compile(torch.nn.Linear(16, 16), recipe="fp8")


def test_compile_and_backend_options_take_names():
    torch.manual_seed(0)
    lin = torch.nn.Linear(32, 16, bias=False)
    x = torch.randn(4, 32)
    by_object = torch.compile(lin, backend="minite", options={"recipe": NVFP4Recipe.te()})(x)
    torch._dynamo.reset()
    by_name = torch.compile(lin, backend="minite", options={"recipe": "te"})(x)
    torch._dynamo.reset()
    by_api = fp4_compile.compile(lin, recipe="te")(x)
    torch._dynamo.reset()
    assert torch.equal(by_object, by_name) and torch.equal(by_object, by_api)
