"""`fp4_compile::rms_norm_quantize_parts` + `::nvfp4_linear_parts` (`nvfp4/norm_parts.py`: the
norm leaving its decode-GEMM codes to the GEMM's prologue) against the ops they replace,
`rms_norm_quantize` / `add_rms_norm_quantize` then `nvfp4_linear_quantized`.

Tier: bitwise (raw bytes). CPU: the references. Interpreter (the ops' kernel path, forced on CPU
tensors): with the interpreter made a decode architecture (the producer runs the norm's first
launch alone, the GEMM quantizes in its prologue, or with an on-grid weight runs row_codes
first) and without (the codes' path): the product, y and h == the old ops' kernel path (the
split norm, row_codes, the GEMM). Rows of very different magnitudes, a zero row, bias."""

import os

import pytest
import torch

from fp4_compile import NVFP4Recipe
from fp4_compile import reference as ref
from fp4_compile.testing import assert_bitwise_equal

STRICT = NVFP4Recipe.strict()
KEY = STRICT.numerics_key
ops = torch.ops.fp4_compile
INTERP = os.environ.get("TRITON_INTERPRET") == "1" and not torch.cuda.is_available()


def _inputs(m, h, n, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-3, 3, m)[:, None]
    x = (torch.randn(m, h, generator=g) * scale).to(dtype)
    x[min(1, m - 1)] = 0.0
    r = (torch.randn(m, h, generator=g) * scale).to(dtype)
    r[min(1, m - 1)] = 0.0
    w = (1.0 + 0.1 * torch.randn(h, generator=g)).to(dtype)
    wq = ref.quantize(torch.randn(n, h, generator=g), block="16x16")
    bias = torch.randn(n, generator=g)
    return x, r, w, wq, bias


def _old(x, r, w, wq, bias, w_ongrid=None):
    """(y, h, product) of the ops the pass replaces."""
    if r is None:
        y, a, gd, xt, gdt = ops.rms_norm_quantize(x, w, 1e-6, KEY, False)
        h = None
    else:
        y, a, gd, xt, gdt, h = ops.add_rms_norm_quantize(x, r, w, 1e-6, KEY, False)
    scales = wq.block_scales.view(torch.uint8)
    out = ops.nvfp4_linear_quantized(
        y, y, wq.codes, scales, wq.global_decode, bias, None, KEY, w_ongrid, 0, a, gd, xt, gdt
    )
    return y, h, out


def _new(x, r, w, wq, bias, w_ongrid=None):
    y, a, gd, parts, h = ops.rms_norm_quantize_parts(x, r, w, 1e-6, KEY)
    scales = wq.block_scales.view(torch.uint8)
    out = ops.nvfp4_linear_parts(
        y, a, gd, parts, wq.codes, scales, wq.global_decode, w_ongrid, bias
    )
    return y, (None if r is None else h), out


def _check(got, want):
    for a, b, what in zip(got, want, ("y", "h", "product")):
        if b is None:
            assert a is None
        else:
            assert_bitwise_equal(a, b, what)


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_cpu_equals_norm_quantize_then_linear_bitwise(residual, dtype):
    x, r, w, wq, bias = _inputs(5, 64, 48, dtype)
    r = r if residual else None
    _check(_new(x, r, w, wq, bias), _old(x, r, w, wq, bias))
    _, _, _, parts, h = ops.rms_norm_quantize_parts(x, r, w, 1e-6, KEY)
    y = _old(x, r, w, wq, bias)[0]
    assert_bitwise_equal(parts, y.abs().amax(dim=1, keepdim=True).float(), "row maxima")
    assert h.numel() == (x.numel() if residual else 0)


def _kernel_path(monkeypatch, decode: bool):
    """Route the new ops and nvfp4_linear_quantized / the norm ops on CPU tensors to their
    kernels (interpreter); `decode`: the interpreter a decode architecture."""
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.nvfp4 import gemm, norm_parts, rms_norm_quantize

    dispatch = (*configs.DECODE_DISPATCH, "interpreter") if decode else configs.DECODE_DISPATCH
    monkeypatch.setattr(configs, "DECODE_DISPATCH", dispatch)
    monkeypatch.setattr(norm_parts, "_kernels", lambda t: True)

    def forward(x, residual, weight, eps, recipe, transposed):
        y2, a, gd, xt, gdt, h2 = rms_norm_quantize._cuda_operands(
            x, weight, eps, transposed, residual
        )
        return y2.reshape(x.shape), a, gd, xt, gdt, h2.reshape(x.shape)

    def linear_quantized(x_ongrid, x_gd, w, bias, out_dtype):
        codes, scales = w.codes, w.block_scales.view(torch.uint8)
        return gemm.cuda_linear_quantized(
            x_ongrid, x_gd, codes, scales, w.global_decode, None, bias, out_dtype
        )

    monkeypatch.setattr(rms_norm_quantize, "_forward", forward)
    monkeypatch.setattr(gemm, "cpu_linear_quantized", linear_quantized)


@pytest.mark.skipif(not INTERP, reason="the kernel path in the interpreter (GPU: tests/gpu)")
@pytest.mark.parametrize("decode", [True, False])
@pytest.mark.parametrize(
    ("rows", "hidden", "residual"),
    # hidden 1040 (65 blocks of 16: the masked tail) with the residual only (its h is masked too)
    [(1, 256, False), (1, 256, True), (3, 64, False), (3, 64, True), (5, 1040, True)],
)
def test_kernel_path_equals_norm_quantize_then_linear_bitwise(
    monkeypatch, decode, residual, rows, hidden
):
    from fp4_compile.codegen.nvfp4 import norm_parts

    x, r, w, wq, bias = _inputs(rows, hidden, 48, torch.float32, seed=rows)
    r = r if residual else None
    with monkeypatch.context() as m:
        _kernel_path(m, decode)
        assert norm_parts.codes_deferred("interpreter", rows) is decode
        _check(_new(x, r, w, wq, bias), _old(x, r, w, wq, bias))


@pytest.mark.skipif(not INTERP, reason="the kernel path in the interpreter (GPU: tests/gpu)")
def test_kernel_path_ongrid_weight_takes_row_codes_bitwise(monkeypatch):
    """An on-grid weight at decode rows: row_codes from the maxima, then the GEMM (no prologue,
    which reads packed weights only): the same product as the codes' path."""
    from fp4_compile.codegen.nvfp4 import gemm_cuda, norm_parts

    x, r, w, wq, bias = _inputs(3, 64, 48, torch.float32, seed=7)
    w_ongrid = wq.on_grid(torch.bfloat16)
    got = {}
    with monkeypatch.context() as m:
        _kernel_path(m, True)
        calls = []
        quantized = gemm_cuda.cuda_linear_quantized

        def spy(x_ongrid, x_gd, w_codes, w_scales, w_gd, w_og, bias_, out_dtype):
            calls.append(w_og is not None)
            return quantized(x_ongrid, x_gd, w_codes, w_scales, w_gd, w_og, bias_, out_dtype)

        m.setattr(norm_parts.impl, "cuda_linear_quantized", spy)
        y, a, gd, parts, _ = ops.rms_norm_quantize_parts(x, r, w, 1e-6, KEY)
        scales = wq.block_scales.view(torch.uint8)
        got["new"] = ops.nvfp4_linear_parts(
            y, a, gd, parts, wq.codes, scales, wq.global_decode, w_ongrid, bias
        )
        assert calls == [True], "the on-grid weight's GEMM must run"
        m.setattr(norm_parts, "codes_deferred", lambda arch, rows: False)
        y, a, gd, parts, _ = ops.rms_norm_quantize_parts(x, r, w, 1e-6, KEY)
        got["old"] = ops.nvfp4_linear_parts(
            y, a, gd, parts, wq.codes, scales, wq.global_decode, w_ongrid, bias
        )
    assert_bitwise_equal(got["new"], got["old"], "product")


def test_fake_shapes_and_bad_parts():
    x, r, w, wq, bias = _inputs(3, 64, 48, torch.float32)
    outs = ops.rms_norm_quantize_parts(x, r, w, 1e-6, KEY)
    assert [tuple(t.shape) for t in outs] == [(3, 64), (3, 64), (3, 1), (3, 1), (3, 64)]
    with torch._subclasses.FakeTensorMode() as mode:
        fx, fr, fw = (mode.from_tensor(t) for t in (x, r, w))
        fake = ops.rms_norm_quantize_parts(fx, fr, fw, 1e-6, KEY)
        assert [(t.shape, t.dtype) for t in fake] == [(t.shape, t.dtype) for t in outs]
    scales = wq.block_scales.view(torch.uint8)
    with pytest.raises(ValueError, match="x_parts"):
        ops.nvfp4_linear_parts(
            outs[0], outs[1], outs[2], outs[3][:2], wq.codes, scales, wq.global_decode, None, None
        )


@pytest.mark.parametrize("residual", [False, True])
def test_opcheck(residual):
    x, r, w, wq, bias = _inputs(3, 64, 48, torch.float32)
    r = r if residual else None
    torch.library.opcheck(ops.rms_norm_quantize_parts.default, (x, r, w, 1e-6, KEY))
    y, a, gd, parts, _ = ops.rms_norm_quantize_parts(x, r, w, 1e-6, KEY)
    scales = wq.block_scales.view(torch.uint8)
    args = (y, a, gd, parts, wq.codes, scales, wq.global_decode, None, bias)
    torch.library.opcheck(ops.nvfp4_linear_parts.default, args)
