"""Do Inductor's generated elementwise kernels round like eager ATen? The probe behind the one
open backend mismatch: the bf16 recipe's Qwen3-30B-A3B-shaped row at 4096 tokens, whose
gradients differ from the eager lowered graph while every opaque op maps equal inputs to equal
outputs (`2026-12-03_grad_localize_gpu_30b4k_bf16.md`), so the difference enters through the
elementwise ops that Inductor generates between them. Each candidate subgraph of that model,
at its shapes, runs eagerly and under `torch.compile` with minite's Inductor settings
(`inductor_as_minite`: the knobs, precision flags and deterministic lowering the backend
pins); the bytes of the forward
output and of every input gradient that differ are counted. A candidate with differing bytes
is a cause; its fix is to make it opaque (an fp4_compile op, like `row_scale`), or a knob.

    python -m tools.elementwise_numerics_gpu [--tokens 4096] [--device cuda]

The last row is the fix: the SwiGLU as `fp4_compile::silu_mul` (what the `lower_silu_muls` pass
emits), compiled, against the plain SwiGLU run eagerly. A diagnostic tool: its pass/fail part (the
fix, rotary, residual adds equal, bitwise) is tests/gpu/test_gpu_elementwise_numerics.py.

Candidates: the MoE experts' SwiGLU (`silu(gate) * up` on the gate_up output, Qwen3-MoE's
`act_fn`), the rotary embedding (transformers' `Qwen3RotaryEmbedding` + `apply_rotary_pos_emb`,
cos / sin computed in the graph), and the residual adds in BF16.
"""

from __future__ import annotations

import argparse

import torch

from benchmarks.common import environment, write_results
from fp4_compile.testing import count_bytes_differ


def _swiglu(gate_up):
    gate, up = gate_up.chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def _swiglu_op(gate_up):
    from fp4_compile.codegen.invariant.silu_mul import silu_mul

    gate, up = gate_up.chunk(2, dim=-1)
    return silu_mul(gate, up)


def _rotary_factory(head_dim: int, device):
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding, apply_rotary_pos_emb

    cfg = Qwen3Config(
        hidden_size=32 * head_dim,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=head_dim,
        max_position_embeddings=4096,
    )
    rope = Qwen3RotaryEmbedding(cfg).to(device)

    def rotary(q, k, positions):
        cos, sin = rope(q, positions)
        q2, k2 = apply_rotary_pos_emb(q, k, cos, sin)
        return q2 + k2.repeat_interleave(q.shape[1] // k.shape[1], dim=1)  # one output

    return rotary


def _residual(x, a, b):
    return (x + a) + b


def candidates(tokens: int, device, *, small: bool = False):
    """(name, fn, inputs, which inputs need grad, eager reference fn or None for fn itself) at the 30B-shaped model's sizes (`small`: a
    few rows, for the CPU smoke test)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    seq = 512 if not small else 16
    batch = max(tokens // seq, 1)
    routed = tokens * 8  # 8 experts per token
    moe_i, hidden, head_dim = (768, 2048, 128) if not small else (64, 128, 32)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).to(device)

    positions = torch.arange(seq, device=device)[None].expand(batch, seq)
    gate_up = randn(routed, 2 * moe_i, scale=3.0)
    return [
        ("MoE SwiGLU silu(gate) * up [T*8, 2I]", _swiglu, [gate_up], [0], None),
        (
            "rotary q, k [B, H, S, D] (cos / sin in the graph)",
            _rotary_factory(head_dim, device),
            [randn(batch, 32, seq, head_dim), randn(batch, 4, seq, head_dim), positions],
            [0, 1],
            None,
        ),
        (
            "residual adds (x + a) + b [T, H]",
            _residual,
            [randn(tokens, hidden), randn(tokens, hidden), randn(tokens, hidden)],
            [0, 1, 2],
            None,
        ),
        (
            "fix: MoE SwiGLU as fp4_compile::silu_mul, compiled, vs the plain SwiGLU eager",
            _swiglu_op,
            [gate_up],
            [0],
            _swiglu,
        ),
    ]


def _run(fn, inputs, grad_idx, grad_out_seed: int):
    xs = [x.detach().clone().requires_grad_(i in grad_idx) for i, x in enumerate(inputs)]
    out = fn(*xs)
    g = torch.Generator(device="cpu").manual_seed(grad_out_seed)
    grad_out = torch.randn(out.shape, generator=g).to(out.dtype).to(out.device)
    out.backward(grad_out)
    return out.detach(), [xs[i].grad for i in grad_idx]


def inductor_as_minite(gm, example_inputs, **unused):
    """Inductor exactly as the minite backend calls it, without the passes: its config patches
    (`inductor_patches` less the cache-key pass), matmul precision and deterministic lowering."""
    from torch._inductor.compile_fx import compile_fx

    from fp4_compile.compiler_pins import (
        aoti_inductor_configs,
        deterministic_lowering,
        pinned_matmul_precision,
    )

    with pinned_matmul_precision(), deterministic_lowering():
        return compile_fx(gm, example_inputs, config_patches=aoti_inductor_configs())


def probe(tokens: int, device, *, small: bool = False) -> list[dict]:
    """One row per candidate: bytes of the forward output and of each input gradient that
    differ between eager and the Inductor-compiled function (minite's settings)."""
    rows = []
    for name, fn, inputs, grad_idx, reference in candidates(tokens, device, small=small):
        torch._dynamo.reset()
        row = {"candidate": name}
        try:
            compiled = torch.compile(fn, fullgraph=True, backend=inductor_as_minite)
            want_y, want_g = _run(reference or fn, inputs, grad_idx, 1)
            got_y, got_g = _run(compiled, inputs, grad_idx, 1)
            row["forward_bytes_differ"] = count_bytes_differ(got_y, want_y)
            row["grad_bytes_differ"] = [count_bytes_differ(a, b) for a, b in zip(got_g, want_g)]
            row["grad_elements"] = [int(t.numel()) for t in want_g]
        except Exception as e:  # recorded, not hidden
            row["error"] = f"{type(e).__name__}: {e}"[:1500]
        print(row, flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    env = environment()
    from fp4_compile.compiler_pins import numerics_knobs

    rows = probe(args.tokens, torch.device(args.device))
    md = [
        f"# Inductor vs eager elementwise numerics, {env['gpu']}, torch {env['torch']}, "
        f"triton {env['triton']}, commit {env['commit']}",
        f"{args.tokens} tokens, Qwen3-30B-A3B-shaped; minite's Inductor settings; eager-numerics "
        f"knobs present: {numerics_knobs()}",
        "",
        "| candidate | forward bytes differ | input grad bytes differ (of elements) |",
        "| --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            md.append(f"| {r['candidate']} | ERROR: {r['error'][:300]} | |")
            continue
        grads = ", ".join(f"{d} ({n})" for d, n in zip(r["grad_bytes_differ"], r["grad_elements"]))
        md.append(f"| {r['candidate']} | {r['forward_bytes_differ']} | {grads} |")
    text = "\n".join(md) + "\n"
    print(text)
    write_results("elementwise_numerics_gpu", {"env": env, "args": vars(args), "rows": rows}, text)


if __name__ == "__main__":
    main()
