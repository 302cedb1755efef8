"""The compiler settings minite pins for numerics, shared by the `minite` backend
(`backend.py`) and the rollout export's AOTInductor package (`rollout/export.py`): Inductor's
options that would break batch invariance or eager rounding, the matmul-precision flags and
the deterministic-algorithms flag, each set for the duration of a compile and restored after.
Core: imports nothing of the package.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

INVARIANCE_INDUCTOR_CONFIG = {
    "split_reductions": False,  # a split reduction's order depends on the reduction size
    "max_autotune": False,  # no runtime autotuning / template selection
    "max_autotune_gemm": False,
    "max_autotune_pointwise": False,
    "coordinate_descent_tuning": False,
    "force_disable_caches": False,
    # Round every op's output to its dtype as eager does and keep Triton from contracting a*b+c
    # into an FMA across ops: otherwise a value's bits may depend on which ops Inductor fused,
    # and the learner's graph and the rollout's prefill/decode graphs fuse differently. (On the
    # H200 this alone did not explain the strict gap: benchmarks/results/*localize_h200*.)
    "emulate_precision_casts": True,
}


# Eager numerics of the traced elementwise ops (SiLU, residual adds, rotary, casts) on the GPU:
# Triton lowers x / y to the approximate `div.full` where eager CUDA rounds (`div.rn`), and may
# flush denormals; then an FP32 model's backward differs from the same graph run eagerly by an
# ulp here and there (tiny Llama FP32 on the H200: 3-4 of 12 gradients in
# benchmarks/results/2026-12-04_backend_gpu_check_c695808.md, the before_stable_sort section;
# 0 with these knobs).
# Older Inductors lack some of them (torch 2.11: no use_pytorch_libdevice): `numerics_knobs()`
# says which this torch has, and the GPU checks print it.
EAGER_NUMERICS_KNOBS = {
    "eager_numerics.division_rounding": True,
    "eager_numerics.disable_ftz": True,
    "eager_numerics.use_pytorch_libdevice": True,
}


# Inductor's C++ (CPU) code: no a*b+c contracted into an FMA and no unsafe math, whatever the
# environment says (DESIGN: nothing that changes numerics is read from environment variables;
# TORCHINDUCTOR_CPP_ENABLE_FLOATING_POINT_CONTRACT_FLAG=fast changes 942 of 4096 values of a*b+c
# here, and a learner graph and a rollout graph fuse differently).
CPU_CODEGEN_PINS = {
    "cpp.enable_floating_point_contract_flag": "off",
    "cpp.enable_unsafe_math_opt_flag": False,
}


def has_config(key: str) -> bool:
    """Whether this torch's Inductor has the config `key` (dotted: "cpp.enable_...")."""
    from torch._inductor import config  # lazy: Inductor costs seconds at `import fp4_compile`

    node = config
    for part in key.split("."):
        if not hasattr(node, part):
            return False
        node = getattr(node, part)
    return True


def numerics_knobs() -> dict:
    """{knob: True if this torch's Inductor has it (and minite sets it), else False}."""
    return {key: has_config(key) for key in EAGER_NUMERICS_KNOBS}


def aoti_inductor_configs() -> dict:
    """The same pinned settings for AOTInductor packages (`aoti_compile_and_package`), so an
    exported rollout's traced ops round like the learner's."""
    configs = dict(INVARIANCE_INDUCTOR_CONFIG)
    configs.update({k: v for k, v in EAGER_NUMERICS_KNOBS.items() if has_config(k)})
    configs.update({k: v for k, v in CPU_CODEGEN_PINS.items() if has_config(k)})
    return configs


@contextlib.contextmanager
def pinned_matmul_precision() -> Iterator[None]:
    """Pin the global matmul-precision flags (no TF32, no reduced-precision reductions) while
    compiling; restore them afterwards."""
    cuda_matmul = torch.backends.cuda.matmul
    saved = (
        cuda_matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
        cuda_matmul.allow_bf16_reduced_precision_reduction,
        cuda_matmul.allow_fp16_reduced_precision_reduction,
    )
    try:
        cuda_matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        cuda_matmul.allow_bf16_reduced_precision_reduction = False
        cuda_matmul.allow_fp16_reduced_precision_reduction = False
        yield
    finally:
        (
            cuda_matmul.allow_tf32,
            torch.backends.cudnn.allow_tf32,
            cuda_matmul.allow_bf16_reduced_precision_reduction,
            cuda_matmul.allow_fp16_reduced_precision_reduction,
        ) = saved


@contextlib.contextmanager
def deterministic_lowering() -> Iterator[None]:
    """Compile forward AND backward now with torch's deterministic-algorithms flag on (warn
    only), restored afterwards. Inductor lowers accumulating scatters (`index_put` with
    accumulate: the backward of the embedding and of the MoE token gather) to atomic adds on the
    GPU, whose order changes from run to run; with the flag on it calls ATen's sorted,
    deterministic kernels instead. The backward is lowered here, not lazily at the first
    backward call, so that the flag is on while it is."""
    from torch._functorch import config as functorch_config  # lazy: as in `has_config`

    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    eager_bwd = (
        functorch_config.patch(force_non_lazy_backward_lowering=True)
        if hasattr(functorch_config, "force_non_lazy_backward_lowering")
        else contextlib.nullcontext()
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with eager_bwd:
            yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
