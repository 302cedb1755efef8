"""The first step's compile notice scales with the model it compiles (issue 57, item 12): the
2-layer tiny preset is the measured 40 s, a deeper model says more."""

from fp4_compile.models import tiny_qwen3
from fp4_compile.rl.train.trainer import compile_notice


def test_notice_scales_with_depth():
    assert "for 2 decoder layers about 40 s" in compile_notice(tiny_qwen3(layers=2))
    assert "for 8 decoder layers about 100 s" in compile_notice(tiny_qwen3(layers=8))
