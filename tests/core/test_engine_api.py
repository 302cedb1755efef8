"""The rollout-engine seam (`fp4_compile/engine_api.py`). Contracts, exact: `check_generate_args`
refuses each bad argument of `generate` with an error that names it (and the request), before any
work, and spells good ones out per request; every engine class has the protocol's methods and
checks its arguments through it (the same message from each)."""

import pytest
import torch

from fp4_compile.engine_api import RolloutEngineProtocol, RolloutOutput, check_generate_args
from fp4_compile.models import tiny_qwen3
from fp4_compile.rl.train.stock_rollout import StockRolloutEngine
from fp4_compile.rollout import RolloutEngine
from fp4_compile.vllm_plugin.engine import VLLMRolloutEngine

GOOD = dict(
    max_new_tokens=4, temperature=1.0, top_k=0, top_p=1.0, seed=0, vocab_size=10, max_seq_len=8
)


def _check(prompts=((1, 2), (3,)), **over):
    return check_generate_args([list(p) for p in prompts], **{**GOOD, **over})


def test_good_arguments_are_spelled_out_per_request():
    args = _check(max_new_tokens=[2, 5], seed=7)
    assert args.budgets == [2, 5] and args.seeds == [7, 8] and not args.greedy
    args = _check(seed=[4, 9], temperature=0.0)
    assert args.budgets == [4, 4] and args.seeds == [4, 9] and args.greedy


@pytest.mark.parametrize(
    "over, error, match",
    [
        (dict(prompts=()), ValueError, r"prompts must be a non-empty list"),
        (dict(prompts=((1,), ())), ValueError, r"prompts\[1\] must be a non-empty list"),
        (dict(max_new_tokens=0), ValueError, r"max_new_tokens must be an int >= 1, got 0"),
        (dict(max_new_tokens=[3]), ValueError, r"max_new_tokens list has 1 entries for 2"),
        (dict(max_new_tokens=[3, 0]), ValueError, r"max_new_tokens\[1\] must be an int >= 1"),
        (dict(temperature=-0.5), ValueError, r"temperature must be >= 0"),
        (dict(temperature="hot"), TypeError, r"temperature must be a number"),
        (dict(top_k=-1), ValueError, r"top_k must be >= 0"),
        (dict(top_p=0.0), ValueError, r"top_p <= 1, got top_k=0, top_p=0.0"),
        (dict(seed=[1]), ValueError, r"seed list has 1 entries for 2 prompts"),
        (dict(seed=[1, -2]), ValueError, r"seed\[1\] must be non-negative"),
        (dict(seed=[1.5, 2]), TypeError, r"seed\[0\] must be an int"),
        (dict(prompts=((1, 2), (3, 10))), ValueError, r"prompts\[1\]\[1\] = 10 is not a token id"),
        (dict(prompts=((-1,), (3,))), ValueError, r"prompts\[0\]\[0\] = -1 is not a token id"),
        (dict(max_new_tokens=[7, 7]), ValueError, r"prompt 0 \(2 tokens\) \+ max_new_tokens \(7\)"),
        (dict(top_k=3, no_filter_reason="why"), ValueError, r"top_k=3, top_p=1.0: no filter"),
        (dict(top_p=0.9, no_filter_reason="why"), ValueError, r"top_p=0.9: no filter here \(why"),
    ],
)
def test_each_bad_argument_is_refused_by_name(over, error, match):
    with pytest.raises(error, match=match):
        _check(**over)


@pytest.mark.parametrize("cls", [RolloutEngine, VLLMRolloutEngine, StockRolloutEngine])
def test_every_engine_class_has_the_protocols_methods(cls):
    for name in ("generate", "update_weights"):
        assert callable(getattr(cls, name, None)), f"{cls.__name__}.{name}"


def test_engines_refuse_through_the_shared_check():
    """The embedded and the stock engine give the shared check's message, before any work."""
    model = tiny_qwen3(layers=1).eval()
    engines = [
        RolloutEngine(model, max_batch=2, max_seq_len=16, compile=False),
        StockRolloutEngine(model, max_batch=2, max_seq_len=16),
    ]
    for engine in engines:
        assert isinstance(engine, RolloutEngineProtocol)
        with pytest.raises(ValueError, match=r"prompts\[1\]\[0\] = 128 is not a token id"):
            engine.generate([[1], [128]], max_new_tokens=2)
        with pytest.raises(ValueError, match=r"prompt 0 \(3 tokens\) \+ max_new_tokens \(14\)"):
            engine.generate([[1, 2, 3]], max_new_tokens=14)


def test_rollout_output_is_shared():
    import fp4_compile.rollout as rollout

    assert rollout.RolloutOutput is RolloutOutput
    out = RolloutOutput(tokens=[[1]], logprobs=[torch.zeros(1)])
    assert out.finish_reasons == []
