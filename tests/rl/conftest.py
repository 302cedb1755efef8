"""Fixtures of the rl tests: a tiny local transformers checkpoint folder (tests/rl/model_dirs.py)."""

import pytest
from model_dirs import save_model_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 1-layer Qwen3 with vocab 64 and a character tokenizer, saved with save_pretrained."""
    return save_model_dir(tmp_path_factory.mktemp("models") / "my-qwen3")
