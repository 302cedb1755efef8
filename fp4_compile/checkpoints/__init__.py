"""NVFP4 checkpoints that inference engines load: compressed-tensors `nvfp4-pack-quantized` and
ModelOpt NVFP4, written from minite's own quantized bytes (`export_checkpoint`) and read back
dequantized (`load_nvfp4_checkpoint`). See docs/checkpoints.md. May import the core (the learner's
weight bytes: `weight_policy`), never passes/, the rollout runtime or rl/."""

from .export import FORMATS, export_checkpoint
from .load import load_nvfp4_checkpoint, read_weights

__all__ = ["FORMATS", "export_checkpoint", "load_nvfp4_checkpoint", "read_weights"]
