"""fp4_compile/weight_policy.py: which modules a recipe keeps BF16."""

from fp4_compile import NVFP4Recipe
from fp4_compile.weight_policy import decide, names_module


def test_a_star_dot_pattern_names_a_module_at_the_graph_root():
    """FSDP2 compiles each decoder layer alone: its MoE router is "mlp.gate" there, and the
    default "*.mlp.gate" must keep it BF16 as it does "model.layers.3.mlp.gate"."""
    assert names_module("model.layers.3.mlp.gate", "*.mlp.gate")
    assert names_module("mlp.gate", "*.mlp.gate")
    assert not names_module("mlp.gate_proj", "*.mlp.gate")
    assert not names_module("mlp.gate", "model.*")
    assert decide(NVFP4Recipe.strict(), "mlp.gate", 128, 2048, 0, 2)[0] == "bf16"
