"""Decode-size quantize and sampling launches, split forms against the forms they replace, same
run (issue 53: every decode kernel fills the GPU at batch 1).

    python -m benchmarks.decode_quantize

Shapes from Qwen3-8B (hidden 4096, MLP 12288, vocabulary 151936) at decode batches: the fused
SwiGLU quantize [M, 12288] and RMSNorm quantize [M, 4096] in their split form (chunk maxima,
then `row_codes_kernel` over column chunks) against their one-launch form (one program per row
block), and the Gumbel noise of a sampled token [B, 151936] (one Triton launch for the hash and
the two torch logs) against its torch form (about 90 launches). The same bits either way (the
tests: tests/gpu/test_gpu_decode_fill.py); only the time differs. ratio = baseline / ours.
"""

from __future__ import annotations

import torch

from benchmarks.common import both, fmt, header, ratio, write_results

BATCHES = (1, 16, 64, 256)


def _pair(name: str, m: int, base, ours) -> dict:
    b, o = both(base), both(ours)
    row = {
        "kernel": name,
        "M": m,
        "baseline_ms": b,
        "ours_ms": o,
        "ratio_launch": ratio(b[0], o[0]),
        "ratio_graph": ratio(b[1], o[1]),
    }
    print(row, flush=True)
    return row


def measure(m: int) -> list[dict]:
    from fp4_compile.codegen.nvfp4.rms_norm_quantize_kernel import rms_norm_quantize
    from fp4_compile.codegen.nvfp4.silu_mul_quantize_kernel import silu_mul_quantize
    from fp4_compile.rollout.sampling import gumbel_noise, gumbel_uniforms_reference

    dev = "cuda"
    a, b = (torch.randn(m, 12288, device=dev, dtype=torch.bfloat16) for _ in range(2))
    x = torch.randn(m, 4096, device=dev, dtype=torch.bfloat16)
    w = torch.randn(4096, device=dev, dtype=torch.bfloat16)
    keys = torch.randint(0, 2**32, (m,), device=dev)
    n = torch.tensor(7, device=dev)

    def torch_noise():
        u = gumbel_uniforms_reference(keys, n, 151936)
        return (-torch.log(-torch.log(u))).to(torch.float32)

    return [
        _pair(
            "silu_mul_quantize [M, 12288]",
            m,
            lambda: silu_mul_quantize(a, b, split=False),
            lambda: silu_mul_quantize(a, b, split=True),
        ),
        _pair(
            "rms_norm_quantize [M, 4096]",
            m,
            lambda: rms_norm_quantize(x, w, 1e-6, split=False),
            lambda: rms_norm_quantize(x, w, 1e-6, split=True),
        ),
        _pair("gumbel_noise [B, 151936]", m, torch_noise, lambda: gumbel_noise(keys, n, 151936)),
    ]


def markdown(lines: list[str], rows: list[dict]) -> str:
    lines += [
        "| kernel | M | baseline ms launch / graph | ours ms launch / graph | ratio launch / "
        "graph |",
        "| --- " * 5 + "|",
    ]
    for r in rows:
        b, o = r["baseline_ms"], r["ours_ms"]
        lines.append(
            f"| {r['kernel']} | {r['M']} | {fmt(b[0])} / {fmt(b[1])} | {fmt(o[0])} / "
            f"{fmt(o[1])} | {fmt(r['ratio_launch'], '.2f')} / "
            f"{fmt(r['ratio_graph'], '.2f')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    env, lines = header("Decode-size quantize (split forms) and Gumbel noise (one launch)")
    rows = [r for m in BATCHES for r in measure(m)]
    payload = {"env": env, "rows": rows}
    for path in write_results("decode_quantize", payload, markdown(lines, rows)):
        print("wrote", path)


if __name__ == "__main__":
    main()
