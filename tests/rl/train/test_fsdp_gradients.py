"""FSDP2 (2 processes, gloo, CPU) gives the single-process gradients, and prints no "wrong
gradients" warning.

The compiled learner's decoder layers return a VIEW of their output (the lowered GEMM's 2D
result reshaped to [N, W, H]), so FSDP2 warns that an in-place op on it "will silently drop the
pre-backward hook ... wrong gradients". No op mutates it: the next layer and the loss read it
out of place. This test is the evidence: one learner step of a tiny 2-layer Qwen3 on a fixed
batch split over 2 ranks, through the minite-compiled learner (bf16 recipe: no quantization, so
the only difference left is the order of the gradient sums and each rank's BF16 rounding of its
partial sums, measured 0.0020 relative in tests/rl/train/test_fsdp.py), and in eager FP32 (equal to
FP32 rounding of the reduction order). A dropped all-gather would give gradients of other
weights (relative error ~1) or a failed backward. rl/train/distributed.py silences exactly that
warning and names this test."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("fsdp_grad_worker.py")
# relative L2 error bound of the 2-process gradient: eager FP32 (reduction order only, a few
# FP32 ulps) and the compiled bf16-recipe learner (per-rank BF16 partial sums, as test_fsdp.py)
TOL_REL = {"eager": 1e-5, "compiled": 1e-2}


def _run(nproc: int, out: Path, mode: str) -> tuple[dict, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(WORKER), str(out), mode]
    if nproc > 1:
        cmd[1:1] = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    return torch.load(f"{out}.grads.pt"), res.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["compiled", "eager"])
def test_two_process_gradients_equal_one_process(tmp_path, mode):
    g1, _ = _run(1, tmp_path / "one", mode)
    g2, stderr = _run(2, tmp_path / "two", mode)
    assert g1.keys() == g2.keys()
    a = torch.cat([g1[n].flatten() for n in g1]).double()
    b = torch.cat([g2[n].flatten() for n in g1]).double()
    rel = float((a - b).norm() / a.norm())
    assert rel < TOL_REL[mode], f"{mode}: relative gradient difference {rel:.3g}"
    for name in g1:  # every tensor, not only the total
        d = float((g1[name] - g2[name]).double().norm() / g1[name].double().norm().clamp_min(1e-30))
        assert d < 10 * TOL_REL[mode], f"{mode}: {name} differs by {d:.3g}"
    assert "wrong gradients" not in stderr, stderr[-2000:]


def test_only_the_view_warning_is_silenced():
    """The filter drops FSDP2's view-tensor warning (its torch 2.13 text) and nothing else."""
    import warnings

    from fp4_compile.rl.train.distributed import ignore_fsdp_view_warning

    view = (
        "FSDP2-wrapped module (FSDPQwen3DecoderLayer) returned a view tensor. An in-place op on "
        "this view (e.g., `x += y`) will silently drop the pre-backward hook and skip the "
        "all-gather, which can cause backward to fail or produce wrong gradients."
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ignore_fsdp_view_warning()
        warnings.warn(view, UserWarning, stacklevel=1)
        warnings.warn("FSDP2-wrapped module (X) did something else", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["FSDP2-wrapped module (X) did something else"]
