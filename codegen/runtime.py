"""Where a Triton kernel runs: CUDA (compiled) or the Triton interpreter (CPU, tests).

Triton is imported lazily: nothing in this module imports it at import time. The interpreter is
selected by `TRITON_INTERPRET=1`, which Triton reads when a kernel module is IMPORTED (at
`@triton.jit`); kernel modules of this package are therefore imported only inside launchers, and
tests set the variable in `tests/conftest.py` (the first module pytest loads) before any import.

Interpreter traps this package works around (verified on Triton 3.7, CPU):
- `tl.dot` on bf16 operands returns garbage, and fp32 -> bf16 casts truncate: in interpreter mode
  the launchers load operands as fp32, use an fp32 `tl.dot` (numpy, `input_precision="ieee"`),
  and write fp32 outputs that torch casts (round to nearest even). On-grid NVFP4 values are exact
  in both bf16 and fp32, so only the accumulation rounding differs from the CUDA path.
- fp32 -> fp8 casts are wrong: E4M3 rounding is done with integer bit operations everywhere.
- `@triton.autotune` with more than one config fails: nothing here autotunes (configs.py pins).

Offsets (the rule every kernel follows): a tensor a kernel indexes may pass 2**31 elements at the
shapes users run (16,384 rows x 151,936 logits = 2.49e9; a batch-256 x 8k-slot KV cache layer =
2.1e9), and Triton computes `index * stride` in int32 when both are int32 (the stride and the
size arguments are int32 below 2**31), which wraps and reads or writes out of bounds (CUDA's
"illegal memory access"). So every index that multiplies a stride is int64 before it does: a
program id as `tl.program_id(a).to(tl.int64)`, an index loaded from memory (a gather) with
`.to(tl.int64)`, and any `tl.arange` that steps over rows of a large tensor widened the same
way. Only offsets bounded by one row (a column index times a unit stride) may stay int32.
`tests/codegen/test_layout.py` checks every kernel source for the program-id rule.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


def interpreting() -> bool:
    """True when Triton kernels run in the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def check_kernel_device(t: torch.Tensor, name: str) -> None:
    """Kernels run on CUDA tensors, or on CPU tensors under the interpreter; nothing else."""
    if t.device.type == "cuda":
        return
    if t.device.type == "cpu" and interpreting():
        return
    raise ValueError(
        f"{name} is on {t.device}: the Triton kernels need CUDA tensors (or CPU tensors with "
        "TRITON_INTERPRET=1); the CPU implementation of the fp4_compile ops is the reference"
    )


def arch_of(device: torch.device) -> str:
    """Config key of a device: 'sm_90', 'sm_100', ..., or 'interpreter' for CPU."""
    if device.type != "cuda":
        return "interpreter"
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}"


def compile_options(device: torch.device) -> dict:
    """Launch options: no FMA contraction on CUDA, so the FP32 epilogue rounds exactly like the
    reference (`(acc * gd_a) * gd_b + bias`, three roundings). The interpreter takes none."""
    if device.type != "cuda":
        return {}
    return {"enable_fp_fusion": False}


def row_mask_bytes(row_mask: torch.Tensor | None, rows: int) -> torch.Tensor | None:
    """A kernel's `row_mask` argument (bool, one per row: [R] or [.., 1]) as R contiguous bytes
    (the bool tensor viewed as uint8; a kernel tests `!= 0`), or None."""
    if row_mask is None:
        return None
    m = row_mask.reshape(-1).contiguous()
    if m.dtype != torch.bool or m.shape[0] != rows:
        raise ValueError(
            f"row_mask must be bool with {rows} rows, got {m.dtype} {tuple(row_mask.shape)}"
        )
    return m.view(torch.uint8)


def row_blocks(x: torch.Tensor) -> tuple[int, int] | None:
    """(I, stride) where the rows of x [.., I, H] are not one contiguous block but blocks of I
    contiguous rows of H, one block every `stride` elements: a column slice of a wider output
    viewed as heads (a fused q/k/v GEMM's q or k at batch > 1, `passes/fuse_group_gemms.py`),
    which a row kernel reads in place. None for a contiguous x or any other layout."""
    if x.dim() < 2 or x.numel() == 0 or x.is_contiguous():
        return None
    inner, hdim = x.shape[-2], x.shape[-1]
    try:
        x3 = x.view(-1, inner, hdim)
    except RuntimeError:  # the leading dims do not merge into one stride
        return None
    if x3.stride(2) != 1 or (inner > 1 and x3.stride(1) != hdim) or x3.stride(0) < inner * hdim:
        return None
    return inner, x3.stride(0)


@dataclass(frozen=True)
class KernelTarget:
    """Where one call's launches run, looked up once per call and handed to each of them: the
    device, its config key (`arch_of`) and the launch options (`compile_options`)."""

    device: torch.device
    arch: str
    options: dict


def kernel_target(t: torch.Tensor, name: str | None = None) -> KernelTarget:
    """The `KernelTarget` of tensor `t`'s device; with a `name`, `t` is first checked to be
    where the kernels run (`check_kernel_device`)."""
    if name is not None:
        check_kernel_device(t, name)
    return KernelTarget(t.device, arch_of(t.device), compile_options(t.device))


def output_buffer(into: torch.Tensor | None, shape, dtype, device) -> torch.Tensor:
    """A launcher's output: a new [shape] buffer, or `into` (the caller's contiguous buffer of
    as many elements of `dtype`, e.g. a weight store's) viewed as [shape]."""
    if into is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if into.dtype != dtype or not into.is_contiguous() or into.device != torch.device(device):
        raise ValueError(
            f"into must be a contiguous {dtype} buffer on {device}, got {into.dtype} on "
            f"{into.device} (contiguous: {into.is_contiguous()})"
        )
    return into.view(shape)
