"""Codegen tests run the Triton kernels in the interpreter when there is no GPU.

Triton reads TRITON_INTERPRET when a kernel module is imported (at `@triton.jit`); the kernel
modules are imported lazily by their launchers, so setting it here, before any test runs, is early
enough. On a CUDA machine the variable is left alone (compiled kernels).
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
