"""`MiniteQwen3MoeForCausalLM`: vLLM's Qwen3-MoE with the learner's ops end to end ("full").

Shape legend: T tokens, E experts, k experts per token, H hidden.

Everything but the MoE block is `MiniteQwen3ForCausalLM`'s (qwen3.py). The MoE block is the
learner's lowering, token by token:
- router logits: the plugin's BF16 invariant linear (the recipe keeps `*.mlp.gate` in BF16);
- routing: minite's `route` (FP32 softmax in a fixed order, stable top-k, renormalization);
- experts: per expert, its tokens through the NVFP4 gate_up GEMM, `fp4_compile::silu_mul` and
  the NVFP4 down GEMM with the learner's per-expert bytes (`experts.py`; the learner's grouped
  GEMM equals this per-expert loop bitwise);
- combine: `moe_combine`'s arithmetic, out[t] = sum over slots j in top-k order of
  y[t, j] * w[t, j], each product and each partial sum rounded to the model dtype.
Dense MLP layers (`mlp_only_layers`) use the dense block.
"""

from __future__ import annotations

import torch
from vllm.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM

from ..codegen.invariant.api import route
from .experts import expert_linear
from .model_folder import FULL_ARCHITECTURES
from .quantization import bf16_linear
from .qwen3 import MiniteQwen3ForCausalLM

ARCHITECTURE = FULL_ARCHITECTURES["qwen3_moe"]


def routed_experts(mlp) -> torch.nn.Module:
    """The module of a vLLM MoE block that holds minite's expert buffers."""
    for m in mlp.experts.modules():
        if getattr(m, "minite_precision", None) == "nvfp4_experts":
            return m
    raise ValueError("this MoE block's experts are not run by the minite method")


class MiniteQwen3MoeForCausalLM(Qwen3MoeForCausalLM):
    """vLLM's Qwen3-MoE whose forward is the learner's (module docstring)."""

    forward = MiniteQwen3ForCausalLM.forward
    attention_block = MiniteQwen3ForCausalLM.attention_block
    compute_logits = MiniteQwen3ForCausalLM.compute_logits
    dense_block = MiniteQwen3ForCausalLM.mlp_block

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        MiniteQwen3ForCausalLM.read_config(self, vllm_config.model_config.hf_config)
        config = vllm_config.model_config.hf_config
        self.minite_top_k = int(config.num_experts_per_tok)
        self.minite_norm_topk = bool(config.norm_topk_prob)

    def mlp_block(self, mlp, x_TH):
        if not hasattr(mlp, "experts"):
            return self.dense_block(mlp, x_TH)
        if getattr(mlp, "shared_expert", None) is not None:
            raise ValueError("shared experts are not supported by the minite model class")
        logits = bf16_linear(x_TH, mlp.gate.weight, None)
        w_Tk, ids_Tk = route(logits, self.minite_top_k, norm_topk_prob=self.minite_norm_topk)
        layer = routed_experts(mlp)
        recipe = layer.quant_method.config.recipe
        y_TkH = x_TH.new_zeros((*ids_Tk.shape, x_TH.shape[-1]))
        for e in torch.unique(ids_Tk).tolist():
            rows, slot = (ids_Tk == e).nonzero(as_tuple=True)
            gate_up = expert_linear(x_TH[rows], layer, "w13", e, recipe)
            gate, up = (t.contiguous() for t in gate_up.chunk(2, dim=-1))
            y_TkH[rows, slot] = expert_linear(
                torch.ops.fp4_compile.silu_mul(gate, up), layer, "w2", e, recipe
            )
        dtype = torch.promote_types(x_TH.dtype, w_Tk.dtype)
        out = (y_TkH[:, 0] * w_Tk[:, 0, None]).to(dtype)
        for j in range(1, ids_Tk.shape[1]):
            out = (out + (y_TkH[:, j] * w_Tk[:, j, None]).to(dtype)).to(dtype)
        return out.to(x_TH.dtype)
