"""`export_checkpoint`: a transformers model -> an NVFP4 checkpoint vLLM / SGLang / TRT-LLM load.

The folder holds `config.json` (the model's config plus the format's `quantization_config`),
`model.safetensors` (the learner's NVFP4 bytes of every linear the recipe quantizes, everything
else in the master dtype), `hf_quant_config.json` for ModelOpt, and the tokenizer when given.
The bytes are minite's own (`quantize_weight_bytes`, the learner's quantizer), never
re-quantized by another library. What an engine computes differently (activation scales, fused
groups) is warned about once and recorded under `quantization_config["minite"]`.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..recipe import NVFP4Recipe, as_recipe
from ..version import __version__
from . import compressed_tensors, modelopt
from .plan import plan_export, split_expert_name

FORMATS = {"compressed-tensors": compressed_tensors, "modelopt": modelopt}
CONFIG = "config.json"
WEIGHTS = "model.safetensors"


def _check_destination(folder: Path) -> None:
    """A new or empty folder, or one holding an earlier minite export (overwritten)."""
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"path {str(folder)!r} exists and is not a folder")
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    try:
        qc = json.loads((folder / CONFIG).read_text()).get("quantization_config") or {}
        ours = "minite" in qc
    except (OSError, ValueError, AttributeError):
        ours = False
    if not ours:
        raise ValueError(
            f"path {str(folder)!r} is a non-empty folder that holds no minite checkpoint export; "
            "choose a new or empty folder"
        )


def _activation_note(recipe: NVFP4Recipe, fmt: str) -> str:
    scale = recipe.activation.global_scale
    static = "input_global_scale" if fmt == "compressed-tensors" else "input_scale"
    return (
        f"minite quantizes activations with a dynamic {scale} global scale, which {fmt} cannot "
        f"express: an engine runs W4A16 (Hopper, Marlin: activations unquantized) or W4A4 with "
        f"the static {static}=1.0 written here (Blackwell), so its activations (not its "
        "weights) differ from minite's learner"
    )


# the dtype an engine (vLLM, transformers) runs an NVFP4 checkpoint in: compressed-tensors
# decompresses to BF16, so a model loaded in the master dtype (FP32) would fail at its first
# linear; the master dtype of the dense tensors (stored as they are) is kept under "minite"
ENGINE_DTYPE = "bfloat16"
# transformers dequantizes per-expert compressed-tensors NVFP4 weights into its fused experts
# without their weight_global_scale (huggingface/transformers#48371): wrong weights, no error
TRANSFORMERS_EXPERTS_NOTE = (
    "transformers' AutoModelForCausalLM.from_pretrained dequantizes the per-expert NVFP4 weights "
    "of this MoE export without their weight_global_scale (huggingface/transformers#48371, fix "
    "in #48372), so its experts come back wrong with no error: load it with "
    "fp4_compile.load_nvfp4_checkpoint (the learner's dequantized weights) or vLLM"
)


def _has_fused_experts(plan) -> bool:
    return any(split_expert_name(q.name) for q in plan.quantized)


def _fused_note(groups: list[str]) -> str:
    return (
        f"fused groups whose shards have different global scales or precisions: {groups}; "
        "vLLM loads each group as one layer with ONE global scale (the max of the shards') and "
        "so dequantizes the other shards wrongly (a mixed group does not load as NVFP4)"
    )


def export_checkpoint(
    model,
    path: str | Path,
    *,
    format: str = "compressed-tensors",  # noqa: A002  (the user-facing name)
    recipe: NVFP4Recipe | dict | str | None = None,
    tokenizer=None,
) -> Path:
    """Write `model` as an NVFP4 checkpoint (`format` "compressed-tensors" or "modelopt") into
    the folder `path` (new, empty, or an earlier export). Returns the folder."""
    if format not in FORMATS:
        raise ValueError(f"format must be one of {sorted(FORMATS)}, got {format!r}")
    recipe = as_recipe(recipe)
    folder = Path(path)
    _check_destination(folder)
    model = getattr(model, "_orig_mod", model)
    plan = plan_export(model, recipe)
    if not plan.quantized:
        raise ValueError(
            f"recipe (fingerprint {recipe.fingerprint()}) quantizes no linear of this model; "
            "nothing to export as NVFP4"
        )
    writer = FORMATS[format]
    master = next(model.parameters()).dtype
    ignore = sorted({"lm_head", *plan.kept_bf16})
    notes = [_activation_note(recipe, format)]
    if plan.fused_mismatch:
        notes.append(_fused_note(plan.fused_mismatch))
    if format == "compressed-tensors" and _has_fused_experts(plan):
        notes.append(TRANSFORMERS_EXPERTS_NOTE)
    minite = {
        "version": __version__,
        "master_dtype": str(master).removeprefix("torch."),
        "recipe": recipe.to_dict(),
        "fingerprint": recipe.fingerprint(),
        "weight_blocks": "16x16 tiles, stored as 1x16 scales (each tile's scale on its 16 rows)",
        "activation_global_scale": recipe.activation.global_scale,
        "fused_groups_with_different_global_scales": plan.fused_mismatch,
        "kept_in_master_dtype": {name: plan.reasons[name] for name in sorted(plan.reasons)},
        "notes": notes,
    }
    tensors = dict(plan.dense)
    for q in plan.quantized:
        tensors.update(writer.tensors(q))
    config = model.config.to_dict()
    config["dtype"] = ENGINE_DTYPE
    config["quantization_config"] = writer.quantization_config(ignore, minite)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt"})
    (folder / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if format == "modelopt":
        hf = modelopt.hf_quant_config(ignore, __version__)
        (folder / modelopt.QUANT_CONFIG_FILE).write_text(json.dumps(hf, indent=2) + "\n")
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    for note in notes:
        warnings.warn(f"export_checkpoint: {note}", UserWarning, stacklevel=2)
    return folder


def master_dtype(config: dict) -> torch.dtype:
    """The dtype the exported model was trained in (its dense tensors' dtype): recorded under
    quantization_config["minite"] (exports before that record: the config's dtype)."""
    minite = (config.get("quantization_config") or {}).get("minite") or {}
    name = (
        minite.get("master_dtype") or config.get("dtype") or config.get("torch_dtype") or "float32"
    )
    return getattr(torch, name)
