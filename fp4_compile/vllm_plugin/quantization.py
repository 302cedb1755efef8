"""The "minite" quantization method of vLLM: every linear through minite's ops, bitwise the
learner's numerics. Imported by `register` (vLLM present); registers itself on import.

Shape legend: M tokens (vLLM's flattened step), K in-features, N out-features (summed over the
shards of a fused layer), S shards (q/k/v: 3, gate/up: 2, others: 1).

Per linear layer, after loading (`process_weights_after_loading`), the layer holds
- `minite_codes` uint8 [N, K/2], `minite_scales` uint8 [N, K/16] (E4M3 bytes) and
  `minite_global_decode` float32 [S]: each shard quantized alone with the learner's quantizer
  (16x16 tiles, the recipe's weight global scale), as the learner quantizes its separate
  q_proj / k_proj / v_proj / gate_proj / up_proj;
- `minite_shards`: the shards' output sizes, and `minite_precision` ("nvfp4" or "bf16", the
  learner's own per-module decision, `weight_policy.gemm_precision`).
`apply` runs one `fp4_compile::nvfp4_linear` per shard and concatenates along N (each output
element is one shard's dot product: the same bits as the learner's separate projections).
BF16 layers and the lm_head run `fp4_compile::invariant_linear` on BF16 operands with the
output in x's dtype, as the learner's lowering emits them (`passes.targets.emit_bf16_linear`).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.linear import (
    LinearBase,
    LinearMethodBase,
    register_weight_loader_v2_supported_method,
)
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    UnquantizedEmbeddingMethod,
)
from vllm.model_executor.parameter import (
    GroupQuantScaleParameter,
    ModelWeightParameter,
    PerTensorScaleParameter,
)
from vllm.model_executor.utils import set_weight_attrs

from ..checkpoints.scales import decode_for_encode
from ..codegen.invariant.api import linear as invariant_linear
from ..codegen.nvfp4.gemm_call import GemmCall, QuantizedWeight
from ..format import BLOCK_SIZE
from ..recipe import NVFP4Recipe
from ..weight_policy import gemm_precision
from .buffers import linear_buffers, write_buffers
from .experts import MiniteExpertsMethod
from .model_folder import QUANTIZATION_NAME, RECIPE_KEY

# vLLM's fused layers -> the learner's module names of their shards, in vLLM's order
FUSED_SHARDS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def learner_names(prefix: str, num_shards: int) -> list[str]:
    """The learner's module paths of a vLLM layer's shards (`model.layers.0.self_attn.qkv_proj`
    -> its q/k/v projections)."""
    parent, _, leaf = prefix.rpartition(".")
    shards = FUSED_SHARDS.get(leaf)
    if shards is None or num_shards == 1:
        return [prefix]
    if len(shards) != num_shards:
        raise ValueError(f"{prefix!r}: {num_shards} shards, expected {len(shards)} ({shards})")
    return [f"{parent}.{s}" for s in shards]


def bf16_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The learner's BF16 GEMM: BF16 operands, FP32 accumulation (batch-invariant), x's dtype."""
    bias = None if bias is None else bias.to(torch.bfloat16)
    return invariant_linear(
        x.to(torch.bfloat16), weight.to(torch.bfloat16), bias, out_dtype=x.dtype
    )


@register_quantization_config(QUANTIZATION_NAME)
class MiniteConfig(QuantizationConfig):
    """vLLM's view of an `NVFP4Recipe` (config.json: `{"quant_method": "minite", "recipe": ...}`,
    or an `export_checkpoint` folder whose quantization config holds it under "minite").
    `prequantized`: the folder holds the learner's NVFP4 bytes (a compressed-tensors export),
    not master weights."""

    def __init__(self, recipe: NVFP4Recipe, *, prequantized: bool = False):
        super().__init__()
        if not isinstance(recipe, NVFP4Recipe):
            raise TypeError(f"recipe must be an NVFP4Recipe, got {type(recipe).__name__}")
        if not recipe.batch_invariant:
            raise ValueError(
                f"recipe (fingerprint {recipe.fingerprint()}) is not batch-invariant: vLLM "
                "batches tokens of unrelated requests into one step"
            )
        self.recipe = recipe
        self.prequantized = prequantized
        self.num_layers: int | None = None

    def get_name(self) -> str:
        return QUANTIZATION_NAME

    def get_supported_act_dtypes(self) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 80

    @staticmethod
    def get_config_filenames() -> list[str]:
        return []

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> MiniteConfig:
        if "minite" in config:  # an export_checkpoint folder
            if config.get("quant_method") != "compressed-tensors":
                raise ValueError(
                    "quantization='minite' loads export_checkpoint folders of format "
                    f"'compressed-tensors', this one is {config.get('quant_method')!r}"
                )
            return cls(NVFP4Recipe.from_dict(config["minite"][RECIPE_KEY]), prequantized=True)
        if RECIPE_KEY not in config:
            raise ValueError(
                "quantization_config holds no minite recipe (expected the key 'recipe', or "
                "'minite': {'recipe': ...} as export_checkpoint writes)"
            )
        return cls(NVFP4Recipe.from_dict(config[RECIPE_KEY]))

    @classmethod
    def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None):
        """An `export_checkpoint` folder (its quantization config holds the recipe under
        "minite") runs through this method when the user asks for quantization="minite"."""
        if user_quant == QUANTIZATION_NAME and "minite" in (hf_quant_cfg or {}):
            return QUANTIZATION_NAME
        return None

    def maybe_update_config(self, model_name, hf_config=None, revision=None):
        cfg = getattr(hf_config, "text_config", None) or hf_config
        if cfg is not None:
            self.num_layers = int(cfg.num_hidden_layers)

    def get_quant_method(self, layer: torch.nn.Module, prefix: str):
        if isinstance(layer, RoutedExperts):
            if self.prequantized:
                raise ValueError(
                    f"{prefix!r}: MoE experts of an export_checkpoint folder are not supported "
                    "by the minite method; load the master-weights folder (write_model_folder)"
                )
            return MiniteExpertsMethod(self, layer, prefix)
        if isinstance(layer, LinearBase):
            return MiniteLinearMethod(self, prefix)
        if isinstance(layer, ParallelLMHead):
            return MiniteLMHeadMethod()
        return None


@register_weight_loader_v2_supported_method
class MiniteLinearMethod(LinearMethodBase):
    """Loads a master weight and runs the layer through minite's ops (module docstring)."""

    def __init__(self, config: MiniteConfig, prefix: str):
        self.config = config
        self.prefix = prefix

    def create_weights(
        self,
        layer: torch.nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ):
        if input_size_per_partition != input_size or sum(output_partition_sizes) != output_size:
            raise ValueError(
                f"{self.prefix!r}: the minite method runs unsharded layers only (tensor "
                "parallel size 1): a shard's per-tensor global scale would not be the learner's"
            )
        weight_loader = extra_weight_attrs.pop("weight_loader")
        layer.minite_shards = tuple(int(n) for n in output_partition_sizes)
        layer.minite_names = learner_names(self.prefix, len(output_partition_sizes))
        layer.minite_precision = self.precision(layer, input_size_per_partition)
        if self.config.prequantized and layer.minite_precision == "nvfp4":
            create_packed_params(
                layer, output_partition_sizes, input_size_per_partition, weight_loader
            )
            return
        weight = ModelWeightParameter(
            data=torch.empty(
                sum(output_partition_sizes), input_size_per_partition, dtype=params_dtype
            ),
            input_dim=1,
            output_dim=0,
            weight_loader=weight_loader,
        )
        layer.register_parameter("weight", weight)
        set_weight_attrs(weight, extra_weight_attrs)

    def precision(self, layer, k: int) -> str:
        """The learner's decision for this layer; the shards of a fused layer must agree."""
        num_layers = self.config.num_layers
        if num_layers is None:
            raise ValueError("MiniteConfig.num_layers is unset (vLLM passes the model config)")
        found = {
            gemm_precision(self.config.recipe, name, n=n, k=k, num_layers=num_layers)[0]
            for name, n in zip(layer.minite_names, layer.minite_shards)
        }
        if len(found) != 1:
            raise ValueError(
                f"{self.prefix!r}: the recipe puts its shards {layer.minite_names} in different "
                f"precisions {sorted(found)}; vLLM runs them as one layer"
            )
        return found.pop()

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if layer.minite_precision != "nvfp4":
            return
        if self.config.prequantized:
            take_packed_params(layer)
        else:
            quantize_layer(layer, self.config.recipe)

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None):
        if layer.minite_precision == "bf16":
            return bf16_linear(x, layer.weight, bias)
        return nvfp4_apply(layer, x, bias, self.config.recipe)


class MiniteLMHeadMethod(UnquantizedEmbeddingMethod):
    """The lm_head as the learner computes it: BF16 operands, FP32 accumulation, batch-invariant
    (the recipe keeps lm_head in BF16 always)."""

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        return

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None):
        return bf16_linear(x, layer.weight, bias)


def create_packed_params(layer, output_partition_sizes, k: int, weight_loader) -> None:
    """compressed-tensors' NVFP4 tensors of an `export_checkpoint` folder, loaded per shard
    (`weight_packed`, `weight_scale`, `weight_global_scale` ENCODE, `input_global_scale`, which
    minite's per-row activation scales do not use)."""
    n, num_shards = sum(output_partition_sizes), len(output_partition_sizes)
    packed = ModelWeightParameter(
        data=torch.empty(n, k // 2, dtype=torch.uint8),
        input_dim=1,
        output_dim=0,
        weight_loader=weight_loader,
    )
    scales = GroupQuantScaleParameter(
        data=torch.empty(n, k // BLOCK_SIZE, dtype=torch.float8_e4m3fn),
        input_dim=1,
        output_dim=0,
        weight_loader=weight_loader,
    )
    layer.register_parameter("weight_packed", packed)
    layer.register_parameter("weight_scale", scales)
    for name in ("weight_global_scale", "input_global_scale"):
        param = PerTensorScaleParameter(
            data=torch.empty(num_shards, dtype=torch.float32), weight_loader=weight_loader
        )
        layer.register_parameter(name, param)


def take_packed_params(layer) -> None:
    """The loaded export bytes -> the layer's NVFP4 buffers; each shard's decode scale is
    fp32(1 / its encode scale), which the export wrote to be minite's decode scale bit for bit."""
    gd = torch.stack([decode_for_encode(ge) for ge in layer.weight_global_scale.data])
    set_nvfp4_bytes(layer, layer.weight_packed.data, layer.weight_scale.data.view(torch.uint8), gd)
    for name in ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale"):
        delattr(layer, name)


def shard_rows(layer) -> list[slice]:
    out, start = [], 0
    for n in layer.minite_shards:
        out.append(slice(start, start + n))
        start += n
    return out


@torch.no_grad()
def quantize_layer(layer: torch.nn.Module, recipe: NVFP4Recipe) -> None:
    """Quantize each shard of `layer.weight` with the learner's quantizer into the layer's
    NVFP4 buffers (created on the first call, written in place afterwards)."""
    write_buffers(layer, linear_buffers(layer.weight.data, layer.minite_shards, recipe))


def set_nvfp4_bytes(layer, codes_NK2, scales_NK16, global_decode_S) -> None:
    """Write a linear layer's NVFP4 bytes in place (buffers created on the first call)."""
    write_buffers(
        layer,
        {
            "minite_codes": codes_NK2,
            "minite_scales": scales_NK16,
            "minite_global_decode": global_decode_S,
        },
    )


def nvfp4_apply(layer, x_MK: torch.Tensor, bias, recipe: NVFP4Recipe) -> torch.Tensor:
    """One `fp4_compile::nvfp4_linear` per shard, concatenated along N."""
    outs = []
    k = x_MK.shape[-1]
    for i, rows in enumerate(shard_rows(layer)):
        n = rows.stop - rows.start
        # the op's `weight` (the master, for autograd) is unused here: a zero-stride stand-in
        stand_in = x_MK.new_zeros(()).expand(n, k)
        w = QuantizedWeight(
            codes=layer.minite_codes[rows],
            scales=layer.minite_scales[rows],
            global_decode=layer.minite_global_decode[i].reshape(()),
        )
        bias_n = None if bias is None else bias[rows]
        outs.append(GemmCall(x=x_MK, weight=stand_in, w=w, recipe=recipe, bias=bias_n).run())
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
