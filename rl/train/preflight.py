"""Checks a `minite train` run makes before any work (no warm start, no run folder, no compile),
so that a model the recipe cannot lower is refused in seconds, naming the modules and the
setting that fixes it, instead of after the warm start as a compile error.

- `check_gemm_shapes(cfg)`: every GEMM the recipe quantizes has K and N multiples of 16 (NVFP4
  blocks are 16 wide and minite never pads); the strict variant refuses the others unless
  `bf16_modules=` names them (`passes/verify.py` would refuse them at compile time).
"""

from __future__ import annotations

import torch

from ...weight_policy import layer_patterns, shape_fallbacks
from .config import TrainConfig, build_model


def model_skeleton(cfg: TrainConfig) -> torch.nn.Module:
    """The run's model with its real module tree and shapes on the meta device (no weights read,
    no memory): `model=DIR`'s config, else the preset's architecture fields."""
    if cfg.model:
        # lazy: transformers is optional (the hf extra) and costs seconds at import
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(cfg.model)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config)
    # the vocabulary sizes only the embedding and lm_head, BF16 in every recipe
    return build_model(cfg, 16, device=torch.device("meta"))


def check_gemm_shapes(cfg: TrainConfig, model: torch.nn.Module | None = None) -> None:
    """Raise ValueError, naming the modules and the `bf16_modules=` setting that keeps them BF16,
    when the strict variant would quantize a GEMM whose K or N is not a multiple of 16."""
    recipe = cfg.recipe()
    if not (recipe.quantize and recipe.batch_invariant):
        return  # other recipes keep such GEMMs BF16 with a warning (passes/verify.py)
    odd = shape_fallbacks(model_skeleton(cfg) if model is None else model, recipe)
    if not odd:
        return
    shown = ", ".join(f"{path} (N={n}, K={k})" for path, n, k in odd[:6])
    more = f" and {len(odd) - 6} more" if len(odd) > 6 else ""
    where = f"model={cfg.model!r}" if cfg.model else f"the {cfg.name!r} preset's model"
    raise ValueError(
        f"{where}: {len(odd)} GEMM(s) have K or N not a multiple of 16 and cannot be NVFP4 "
        f"(minite never pads): {shown}{more}. The "
        f"{cfg.variant} variant never falls back to BF16 silently: keep them BF16 with "
        f"'bf16_modules={','.join(layer_patterns([p for p, _, _ in odd]))}' (a setting, "
        "key=value, quoted for the shell), or use a model whose sizes are multiples of 16"
    )
