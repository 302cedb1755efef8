"""Suite-wide hooks. Tests marked `gpu` skip, with their reason, where there is no CUDA device,
so `python -m pytest` stays green on CPU machines and `python -m pytest -m gpu` runs every GPU
correctness check on a GPU machine (tests/gpu/)."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    needs_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(needs_gpu)
