"""`minite demo`: quantize a real (Qwen3-shaped) linear layer to NVFP4, report, round-trip."""

from __future__ import annotations

import os
import tempfile

import torch
from safetensors.torch import load_file, save_file

from . import NVFP4Recipe, dequantize, from_swizzled, nvfp4_mm, quantize, to_swizzled
from .serialization import nvfp4_from_tensors, nvfp4_to_tensors
from .testing import count_bytes_differ, sqnr_db


def run_demo(
    *, hidden: int, intermediate: int, num_tokens: int, seed: int, out_dir: str | None
) -> int:
    torch.manual_seed(seed)
    recipe = NVFP4Recipe.strict()
    layer = torch.nn.Linear(hidden, intermediate, bias=False)  # default (Kaiming-uniform) init
    w = layer.weight.detach()
    x = torch.randn(num_tokens, hidden)
    x[:, torch.randperm(hidden)[:8]] *= 20.0  # a few outlier channels, as real activations have

    w_q = quantize(w, block=recipe.weight.block, global_scale=recipe.weight.global_scale)
    x_q = quantize(x, block=recipe.activation.block, global_scale=recipe.activation.global_scale)
    y_ref = x.double() @ w.double().T
    y_bf16 = (x.bfloat16() @ w.bfloat16().T).float()
    y_fp4 = nvfp4_mm(x_q, w_q)

    print(
        f"minite demo: Linear({hidden} -> {intermediate}), {num_tokens} tokens, recipe {recipe.fingerprint()}"
    )
    print(f"  weight  16x16 per-tensor : SQNR {sqnr_db(w, dequantize(w_q)):6.2f} dB")
    print(f"  input   1x16  per-row    : SQNR {sqnr_db(x, dequantize(x_q)):6.2f} dB")
    print(f"  output  W4A4 (reference) : SQNR {sqnr_db(y_ref, y_fp4):6.2f} dB vs float64")
    print(f"  output  BF16             : SQNR {sqnr_db(y_ref, y_bf16):6.2f} dB vs float64")
    bits = (w_q.codes.numel() * 8 + w_q.block_scales.numel() * 8 + 32) / w.numel()
    print(f"  storage : {bits:.3f} bits per weight (BF16: 16)")

    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        folder = out_dir or tmp
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "demo_layer.safetensors")
        save_file(nvfp4_to_tensors(w_q, "weight"), path)
        back = nvfp4_from_tensors(load_file(path), "weight")
        same = back.bytes_equal(w_q)
        ok &= same
        print(
            f"  safetensors round trip   : {'bitwise equal' if same else 'DIFFERENT'} ({path if out_dir else 'tmp'})"
        )
    swz = to_swizzled(w_q.block_scales)
    lin = from_swizzled(swz, *w_q.block_scales.shape)
    same = count_bytes_differ(lin, w_q.block_scales) == 0
    ok &= same
    print(
        f"  swizzled 128x4 scales    : {'bitwise equal' if same else 'DIFFERENT'} after round trip"
    )
    # Idempotence: re-quantizing the dequantized values gives back the same codes (except that a
    # -0 code, 8, comes back as +0, code 0: -0.0 encodes as code 0, as in TE) and the same block
    # scales; the FP32 global scale 2688/amax' can move by an ulp, as TE's op order implies.
    grid = dequantize(x_q)
    x_q2 = quantize(grid, global_scale="per_row")
    c1, c2 = x_q.unpacked_codes(), x_q2.unpacked_codes()
    codes_same = bool(((c1 == c2) | ((c1 == 8) & (c2 == 0))).all())
    scales_same = count_bytes_differ(x_q.block_scales, x_q2.block_scales) == 0
    ulps = (x_q.global_decode.view(torch.int32) - x_q2.global_decode.view(torch.int32)).abs().max()
    ok &= codes_same and scales_same and int(ulps) <= 1
    print(
        f"  requantize(dequantize(x)): codes {'same' if codes_same else 'DIFFERENT'} (-0 -> +0), "
        f"block scales {'same' if scales_same else 'DIFFERENT'}, global scales within {int(ulps)} ulp"
    )
    print("OK" if ok else "FAILED")
    return 0 if ok else 1
