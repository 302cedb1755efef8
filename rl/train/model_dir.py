"""`check_model_dir` moved to the core (`fp4_compile/model_dir.py`: it reads files only, and
`minite diagnose` checks folders with it too); its names stay importable from here."""

from ...model_dir import (
    REFUSED_MODEL_TYPES,
    SUPPORTED_MODEL_TYPES,
    TOKENIZER_FILES,
    WEIGHT_GLOBS,
    check_model_dir,
    check_safetensors,
)

__all__ = [
    "REFUSED_MODEL_TYPES",
    "SUPPORTED_MODEL_TYPES",
    "TOKENIZER_FILES",
    "WEIGHT_GLOBS",
    "check_model_dir",
    "check_safetensors",
]
