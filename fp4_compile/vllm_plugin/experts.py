"""The "minite" method of vLLM's routed MoE experts: every expert GEMM through
`fp4_compile::nvfp4_linear` with the learner's bytes.

Shape legend: T tokens, E experts, H hidden, I expert intermediate, k experts per token.

vLLM's `w13_weight` [E, 2I, H] (gate rows, then up rows) and `w2_weight` [E, H, I] are the
learner's `experts.gate_up_proj` and `experts.down_proj` (transformers 5 fused experts); after
loading each is quantized as the learner quantizes it (16x16 tiles, one global scale per expert
over gate and up together) into `minite_w13_*` / `minite_w2_*` buffers. `apply` takes vLLM's
routing (its router's top-k: not the learner's routing op) and runs, per expert, the NVFP4
gate_up GEMM on its tokens, `fp4_compile::silu_mul`, the NVFP4 down GEMM, and adds the
router-weighted result into the output. So the expert GEMMs are minite's; routing and the
combine order are vLLM's ("linears only").
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
    UnquantizedFusedMoEMethod,
)

from ..codegen.nvfp4.gemm_call import GemmCall, QuantizedWeight
from ..recipe import NVFP4Recipe
from ..weight_policy import gemm_precision
from .buffers import expert_buffers, write_buffers

# vLLM's expert weight -> the learner's parameter under the experts module
LEARNER_PARAMS = {"w13": "gate_up_proj", "w2": "down_proj"}


def expert_linear(x_TK, layer, name: str, e: int, recipe: NVFP4Recipe) -> torch.Tensor:
    """Expert e's `name` GEMM ("w13" gate_up, "w2" down) on its tokens x_TK: `nvfp4_linear`
    with the expert's bytes."""
    codes = getattr(layer, f"minite_{name}_codes")[e]
    n, k = codes.shape[0], x_TK.shape[-1]
    stand_in = x_TK.new_zeros(()).expand(n, k)  # the op's master weight: unused here
    w = QuantizedWeight(
        codes=codes,
        scales=getattr(layer, f"minite_{name}_scales")[e],
        global_decode=getattr(layer, f"minite_{name}_global_decode")[e].reshape(()),
    )
    return GemmCall(x=x_TK, weight=stand_in, w=w, recipe=recipe).run()


class MiniteExpertsMethod(UnquantizedFusedMoEMethod):
    """vLLM's unquantized expert weights and loading; minite's NVFP4 expert GEMMs."""

    def __init__(self, config, layer: torch.nn.Module, prefix: str):
        super().__init__(layer.moe_config)
        self.config = config
        self.prefix = prefix

    @property
    def is_monolithic(self) -> bool:
        return False  # vLLM's router selects the experts, then calls `apply`

    def create_weights(
        self,
        layer,
        num_experts,
        hidden_size,
        intermediate_size_per_partition,
        params_dtype,
        **extra_weight_attrs,
    ):
        super().create_weights(
            layer,
            num_experts,
            hidden_size,
            intermediate_size_per_partition,
            params_dtype,
            **extra_weight_attrs,
        )
        num_layers = self.config.num_layers
        if num_layers is None:
            raise ValueError("MiniteConfig.num_layers is unset (vLLM passes the model config)")
        for name, n, k in (
            ("w13", 2 * intermediate_size_per_partition, hidden_size),
            ("w2", hidden_size, intermediate_size_per_partition),
        ):
            precision, reason = gemm_precision(
                self.config.recipe, self.prefix, n=n, k=k, num_layers=num_layers
            )
            if precision != "nvfp4":
                raise ValueError(
                    f"{self.prefix!r} {name}: the recipe keeps these experts in BF16 ({reason}); "
                    "the plugin runs NVFP4 experts only"
                )
        layer.minite_names = tuple(f"{self.prefix}.{p}" for p in LEARNER_PARAMS.values())
        layer.minite_precision = "nvfp4_experts"

    def process_weights_after_loading(self, layer) -> None:
        # quantize the loaded weights first: vLLM's own set-up may re-lay them for its kernels
        write_buffers(
            layer, expert_buffers(layer.w13_weight.data, layer.w2_weight.data, self.config.recipe)
        )
        super().process_weights_after_loading(layer)

    def apply(self, layer, x, topk_weights, topk_ids, shared_experts, shared_experts_input):
        if shared_experts is not None:
            raise ValueError(f"{self.prefix!r}: shared experts are not supported by the plugin")
        recipe = self.config.recipe
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in torch.unique(topk_ids).tolist():
            rows, slot = (topk_ids == e).nonzero(as_tuple=True)
            gate_up = expert_linear(x[rows], layer, "w13", e, recipe)
            gate, up = (t.contiguous() for t in gate_up.chunk(2, dim=-1))
            y = expert_linear(torch.ops.fp4_compile.silu_mul(gate, up), layer, "w2", e, recipe)
            out.index_add_(0, rows, y.float() * topk_weights[rows, slot, None].float())
        return out.to(x.dtype)
