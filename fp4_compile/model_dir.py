"""`check_model_dir(path)`: is a folder a transformers checkpoint minite can train (`model=DIR`)?

Checked in milliseconds, from the files alone (no transformers import, no weights loaded), so a
folder that cannot work is refused before the tokenizer, the warm start or a compile start, with
the file, the cause and what to do:
- the folder and its config.json exist and parse;
- its `model_type` is a family minite lowers (`SUPPORTED_MODEL_TYPES`; Gemma2 is refused: its
  attention soft-capping needs transformers' eager attention, which minite does not lower);
- it holds weights (a config-only folder would silently train random weights), every
  safetensors file is whole (its header parses and its tensors end where the file ends), and
  every shard a `model.safetensors.index.json` names is there;
- it holds a tokenizer (tokenizer.json or tokenizer_config.json).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

# config.json `model_type` -> family of fp4_compile.models.ARCHITECTURES (each one trains
# through the backend with rollout == learner bitwise: tests/core/test_architectures.py)
SUPPORTED_MODEL_TYPES = {
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3_moe",
    "qwen2": "qwen2",
    "llama": "llama",
    "mistral": "mistral",
    "mixtral": "mixtral",
    "gemma": "gemma",
    "gemma3_text": "gemma3",
    "phi3": "phi3",
    "olmo2": "olmo2",
    "olmoe": "olmoe",
}
# model types refused with a reason of their own
REFUSED_MODEL_TYPES = {
    "gemma2": (
        "Gemma2's attention soft-capping runs only with transformers' "
        "attn_implementation='eager', which minite does not lower (minite lowers SDPA attention); "
        "ignore transformers' advice to load it eager: use a Gemma or Gemma3 checkpoint instead"
    ),
}
WEIGHT_GLOBS = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def _supported() -> str:
    return ", ".join(sorted(SUPPORTED_MODEL_TYPES))


def check_safetensors(path: Path) -> None:
    """Refuse a safetensors file that is truncated or whose header does not parse, naming it."""
    size = path.stat().st_size
    fix = "download or save it again"
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{str(path)!r} is truncated ({size} bytes, no header): {fix}")
        (header_len,) = struct.unpack("<Q", head)
        if 8 + header_len > size:
            raise ValueError(
                f"{str(path)!r} is truncated: its header needs {8 + header_len} bytes, the file "
                f"has {size}: {fix}"
            )
        try:
            header = json.loads(f.read(header_len))
        except ValueError as e:
            raise ValueError(
                f"{str(path)!r} has a header that does not parse ({e}): {fix}"
            ) from None
    ends = [
        t["data_offsets"][1]
        for k, t in header.items()
        if k != "__metadata__" and isinstance(t, dict) and "data_offsets" in t
    ]
    need = 8 + header_len + max(ends, default=0)
    if need != size:
        what = "truncated" if need > size else "longer than its tensors"
        raise ValueError(
            f"{str(path)!r} is {what}: its tensors end at byte {need}, the file has {size}: {fix}"
        )


def check_model_dir(path: str | Path) -> dict:
    """Raise ValueError naming `model`, the file and the fix if `path` is not a checkpoint folder
    minite can train; return its parsed config.json."""
    folder = Path(path)
    where = f"model={str(path)!r}"
    if not folder.is_dir():
        raise ValueError(
            f"{where}: model must be a local transformers checkpoint directory holding "
            "config.json (no such folder)"
        )
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ValueError(
            f"model must be a local transformers checkpoint directory holding config.json, got "
            f"{where} (no {str(config_file)!r})"
        )
    try:
        config = json.loads(config_file.read_text())
    except ValueError as e:
        raise ValueError(f"{where}: {str(config_file)!r} is not valid JSON ({e})") from None
    model_type = config.get("model_type")
    arch = ", ".join(config.get("architectures") or []) or "no architectures"
    if model_type in REFUSED_MODEL_TYPES:
        raise ValueError(
            f"{where}: {str(config_file)!r} has model_type {model_type!r} ({arch}): "
            f"{REFUSED_MODEL_TYPES[model_type]}"
        )
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"{where}: {str(config_file)!r} has model_type {model_type!r} ({arch}), an "
            f"architecture minite does not lower; supported model types: {_supported()} (README, "
            "'Architectures'). Use a checkpoint of one of these families"
        )
    weights = sorted(p for g in WEIGHT_GLOBS for p in folder.glob(g))
    index_file = folder / "model.safetensors.index.json"
    if index_file.is_file():
        try:
            shards = set(json.loads(index_file.read_text())["weight_map"].values())
        except (ValueError, KeyError, AttributeError) as e:
            raise ValueError(f"{where}: {str(index_file)!r} does not parse ({e!r})") from None
        missing = sorted(s for s in shards if not (folder / s).is_file())
        if missing:
            raise ValueError(
                f"{where}: {str(index_file)!r} names shards that are not in the folder: "
                f"{missing}; download them too"
            )
    if not weights:
        raise ValueError(
            f"{where} holds config.json but no weights (model.safetensors or "
            "pytorch_model.bin): training it would start from random weights. Download the "
            "weights too (e.g. huggingface-cli download REPO --local-dir DIR), or leave model= "
            "out to train the preset's random-init model"
        )
    for p in weights:
        if p.suffix == ".safetensors":
            check_safetensors(p)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        raise ValueError(
            f"{where} holds no tokenizer ({' or '.join(TOKENIZER_FILES)}): minite builds the "
            "prompts with the checkpoint's own tokenizer; save it into the folder "
            "(tokenizer.save_pretrained(DIR))"
        )
    return config
