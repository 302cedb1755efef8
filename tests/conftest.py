"""Suite-wide hooks. Tests marked `gpu` skip, with their reason, where there is no CUDA device,
so `python -m pytest` stays green on CPU machines and `python -m pytest -m gpu` runs every GPU
correctness check on a GPU machine (tests/gpu/). `--k-chunk KC` runs the suite under another K
summation order of the forward GEMMs (a what-if: the order split-K decode needs, before it is
pinned).

Without a GPU the Triton kernels run in the interpreter: Triton reads TRITON_INTERPRET when
`triton.language` and each kernel module are imported (at `@triton.jit`), so it is set here, the
first module pytest loads, before any test module imports Triton (a module that imported it
before the variable was set left `tl.sum` and its kin compiled-mode functions, and every later
interpreted kernel calling them failed). On a CUDA machine the variable is left alone."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser):
    parser.addoption(
        "--k-chunk",
        type=int,
        default=None,
        metavar="KC",
        help="what-if: the learner's forward GEMM and the decode GEMM sum K in chunks of KC "
        "(codegen/configs.py K_CHUNK, both forward ops of this machine's architecture) for the "
        "whole run, e.g. `-m gpu tests/gpu/test_gpu_alignment.py --k-chunk 1024` checks the "
        "bitwise contract under the order split-K decode needs; 0 = one chain",
    )


def pytest_configure(config):
    kc = config.getoption("--k-chunk")
    if kc is None:
        return
    from fp4_compile.codegen import configs

    what_if = configs.what_if_k_chunk("sm_90" if torch.cuda.is_available() else "interpreter", kc)
    try:
        what_if.__enter__()  # for the whole session
    except ValueError as e:
        raise pytest.UsageError(f"--k-chunk: {e}") from None


def pytest_report_header(config):
    kc = config.getoption("--k-chunk")
    if kc is not None:
        return f"what-if: forward GEMMs' K chunk KC = {kc} (--k-chunk), not the pinned order"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    needs_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(needs_gpu)
