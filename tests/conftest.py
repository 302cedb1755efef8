"""Suite-wide hooks. Tests marked `gpu` skip, with their reason, where there is no CUDA device,
so `python -m pytest` stays green on CPU machines and `python -m pytest -m gpu` runs every GPU
correctness check on a GPU machine (tests/gpu/). `--k-chunk KC` runs the suite under another K
summation order of the forward GEMMs (a what-if: the order split-K decode needs, before it is
pinned)."""

import pytest
import torch


def pytest_addoption(parser):
    parser.addoption(
        "--k-chunk", type=int, default=None, metavar="KC",
        help="what-if: the learner's forward GEMM and the decode GEMM sum K in chunks of KC "
        "(codegen/configs.py K_CHUNK, both forward ops of this machine's architecture) for the "
        "whole run, e.g. `-m gpu tests/gpu/test_gpu_alignment.py --k-chunk 1024` checks the "
        "bitwise contract under the order split-K decode needs; 0 = one chain",
    )  # fmt: skip


def pytest_configure(config):
    kc = config.getoption("--k-chunk")
    if kc is None:
        return
    from fp4_compile.codegen import configs

    arch = "sm_90" if torch.cuda.is_available() else "interpreter"
    for op in ("nvfp4_gemm", "nvfp4_gemm_ongrid"):
        blocks = {c.block_k for key, table in configs.PINNED.items() if key[:1] == (arch,)
                  and key[2] == op for _, c in table}  # fmt: skip
        if op == "nvfp4_gemm":
            blocks |= {c.block_k for _, c in configs.DECODE[arch]}
        if kc < 0 or (kc and any(kc % b for b in blocks)):
            raise pytest.UsageError(
                f"--k-chunk {kc}: KC must be 0 or a multiple of every BLOCK_K of {op} on {arch} "
                f"({sorted(blocks)})"
            )
        configs.K_CHUNK[(arch, op)] = kc


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
