"""The largest rollout batch an 80 GB card holds (issue 54): weights in BF16 vs NVFP4, the rest
of the card for the KV cache, at a real model's shape (Qwen3-8B dense, Qwen3-30B-A3B MoE, all
their layers, full vocabulary). CPU, shapes only (meta tensors): no kernel runs.

Weights:
- BF16: every parameter in BF16 (what a BF16 engine holds).
- NVFP4 (what minite's strict step reads): the quantized weights' packed bytes (E2M1 codes, one
  E4M3 scale per 16 values, the global decode) as the weight store holds them, priced by the step
  cost model's once-per-weight-version rows (the outputs of each weight's quantize, not the
  refresh's scratch: a shared-scale group's amax, the experts' row maxima); every other parameter (embeddings, head, norms, the MoE router:
  `NVFP4Recipe.bf16_modules`) in BF16. Per layer = the 2-layer model minus the 1-layer one.
- minite's engine, two rows (`RolloutEngine(weights=...)`, `RolloutEngine.weight_bytes()`):
  the default ("bf16+packed") holds BOTH the BF16 parameters it re-quantizes from (its
  `update_weights` copies the learner's weights into them) and the packed store; the packed-only
  engine (weights="packed") releases the BF16 storage of the weights the store holds and
  quantizes the learner's tensors straight into the store: it holds the NVFP4 row's bytes
  (`tests/benchmarks/test_kv_capacity.py` checks both rows against the engine at a tiny shape).
KV cache: BF16 keys and values, 2 x layers x KV heads x head_dim x 2 bytes per token. The card:
80 GB (80e9 bytes) less a reserve for the CUDA context, activations and workspace (--reserve-gib).

Concurrent requests that fit:
- by tokens (a slot pool or paged cache: each request holds the slots it has filled): KV tokens
  / the mean request length of the long-tail distribution (prompt + mean response of the
  lognormal of `benchmarks.rollout_long_tail`, capped at the budget);
- paged (minite's `RolloutEngine(kv_cache="paged", kv_memory_bytes=...)`, pages of --page
  tokens): the pool's pages less the scratch page / the mean pages a request holds at its end:
  ceil((prompt + min(response - 1 + RESERVE_AHEAD, budget - 1)) / page) (the engine reserves a
  running request's pages up to its next host check; the last sampled token is never written),
  averaged over draws of the same lognormal (`long_tail_lengths`, seed 0);
- static (batch x max_seq_len, `RolloutEngine(kv_cache="static")`, the default): KV tokens /
  (prompt + budget).

    python -m benchmarks.kv_capacity [--prompt 1024] [--budget 8192] [--median-frac 0.125]
        [--sigma 1.0] [--reserve-gib 6] [--page 64]
"""

from __future__ import annotations

import argparse
import math

import torch

from benchmarks.common import environment, write_results
from fp4_compile.models import REAL_SHAPES, build_causal_lm, real_shape_config

CARD_BYTES = 80e9
MODELS = ("qwen3-8b", "qwen3-30b-a3b")
# the tokens the engine reserves a running request's pages ahead: its host-check interval
# (`fp4_compile/rollout/engine.py`, _EOS_CHECK_EVERY; tests/benchmarks/test_kv_capacity.py)
RESERVE_AHEAD = 8


def weight_bytes(name: str) -> dict:
    """BF16 and NVFP4 weight bytes of the whole `name` model (per layer from 1 and 2 layers)."""
    return weight_forms(
        lambda layers: build_causal_lm(name, layers=layers, device="meta"),
        layers=REAL_SHAPES[name][3],
    )


def weight_forms(build, *, layers: int) -> dict:
    """The weight bytes of each form (module docstring) of a `layers`-layer model, from the
    1- and 2-layer models `build(layers)` makes."""
    full = layers
    bf16, packed = {}, {}
    for n in (1, 2):
        model = build(n)
        bf16[n] = sum(p.numel() * p.element_size() for p in model.parameters())
        packed[n] = _stored_bytes(model)
        # the BF16 bytes of the parameters the store quantizes (read once by each refresh)
        if n == 1:
            quantized_bf16 = _quantized_bf16_bytes(model)
    layer_bf16, layer_packed = bf16[2] - bf16[1], packed[2] - packed[1]
    rest_bf16 = bf16[1] - layer_bf16  # embeddings, head, final norm
    layer_quantized_bf16 = quantized_bf16
    layer_nvfp4 = layer_packed + (layer_bf16 - layer_quantized_bf16)
    return {
        "layers": full,
        "bf16": rest_bf16 + full * layer_bf16,
        "nvfp4": rest_bf16 + full * layer_nvfp4,
        "minite_engine_default": rest_bf16 + full * (layer_bf16 + layer_packed),
        "minite_engine_packed": rest_bf16 + full * layer_nvfp4,
        "per_layer": {"bf16": layer_bf16, "nvfp4": layer_nvfp4, "packed": layer_packed},
    }


def _stored_bytes(model) -> int:
    """Bytes the weight store holds for `model` under the strict recipe: the outputs (codes,
    block scales, global decode) of the step's once-per-weight-version quantizes, as priced by
    the cost model's rows, less the refresh's scratch those rows also count (a shared-scale
    group's amax, the experts' row maxima)."""
    from fp4_compile.cost.rollout import lowered_step
    from fp4_compile.cost.rules import step_costs

    program = lowered_step(model, "strict", batch=1, tokens=1, context=16, max_seq_len=16)
    sig = program.graph_signature
    _, per_version = step_costs(
        program.graph_module,
        params=set(sig.inputs_to_parameters),
        caches=set(sig.user_inputs[3:]),
        context=16,
        expert_fraction=1.0,
    )
    nodes = {n.name: n for n in program.graph_module.graph.nodes}
    total = 0
    for row in per_version:
        if not row.op.endswith("group_amax"):
            outputs = nodes[row.nodes[0]].meta["val"]
            total += sum(t.numel() * t.element_size() for t in outputs if t is not None)
    return total


def _quantized_bf16_bytes(model) -> int:
    """BF16 bytes of the 1-layer model's weights the strict recipe quantizes: the GEMM weights
    of the decoder layer outside `NVFP4Recipe.bf16_modules` (2-D linear weights and 3-D fused
    expert weights), the same selection the lowering makes."""
    from fnmatch import fnmatch

    from fp4_compile import NVFP4Recipe

    skip = NVFP4Recipe.strict().bf16_modules
    total = 0
    for name, p in model.named_parameters():
        module = name.rsplit(".", 1)[0]
        if ".layers." in f".{name}" and p.dim() >= 2 and not any(fnmatch(module, s) for s in skip):
            total += p.numel() * p.element_size()
    return total


def kv_bytes_per_token(name: str) -> int:
    cfg = real_shape_config(name, layers=REAL_SHAPES[name][3])
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2


def mean_response(budget: int, median_frac: float, sigma: float) -> float:
    """Mean of min(lognormal(mu, sigma), budget), mu = log(budget * median_frac)."""
    mu, cap = math.log(budget * median_frac), math.log(budget)
    normal = torch.distributions.Normal(0.0, 1.0)
    a = (cap - mu) / sigma
    below = math.exp(mu + sigma**2 / 2) * float(normal.cdf(torch.tensor(a - sigma)))
    return below + budget * (1.0 - float(normal.cdf(torch.tensor(a))))


def mean_paged_tokens(
    prompt: int, budget: int, median_frac: float, sigma: float, page: int, draws: int = 200_000
) -> float:
    """The mean tokens (whole pages) a paged request holds at its end (module docstring)."""
    from benchmarks.rollout_long_tail import long_tail_lengths

    lengths = long_tail_lengths(draws, budget, median_frac=median_frac, sigma=sigma, seed=0)
    resp = torch.as_tensor(lengths, dtype=torch.float64)
    held = prompt + torch.minimum(resp - 1 + RESERVE_AHEAD, torch.tensor(budget - 1.0))
    return float((torch.ceil(held / page) * page).mean())


FORM_LABEL = {
    "bf16": "BF16 weights",
    "nvfp4": "NVFP4 weights (what the strict step reads)",
    "minite_engine_default": 'minite engine, weights="bf16+packed" (default: BF16 + packed)',
    "minite_engine_packed": 'minite engine, weights="packed" (packed only)',
}


def capacity(args) -> dict:
    mean_len = args.prompt + mean_response(args.budget, args.median_frac, args.sigma)
    paged_len = mean_paged_tokens(args.prompt, args.budget, args.median_frac, args.sigma, args.page)
    out = {
        "mean_request_tokens": mean_len,
        "paged_request_tokens": paged_len,
        "static_request_tokens": args.prompt + args.budget,
    }
    free_card = CARD_BYTES - args.reserve_gib * 2**30
    for name in MODELS:
        w, kv = weight_bytes(name), kv_bytes_per_token(name)
        rows = {}
        for form in FORM_LABEL:
            kv_room = max(free_card - w[form], 0)
            tokens = int(kv_room // kv)
            rows[form] = {
                "weights_gb": w[form] / 1e9,
                "kv_gb": kv_room / 1e9,
                "kv_tokens": tokens,
                "requests_by_tokens": int(tokens // mean_len),
                "requests_paged": int(max(tokens // args.page - 1, 0) * args.page // paged_len),
                "requests_static": int(tokens // out["static_request_tokens"]),
            }
        out[name] = {"kv_bytes_per_token": kv, "weights": w, "rows": rows}
    return out


def report(res: dict, args, env: dict) -> str:
    lines = [
        f"# Rollout batch that fits an 80 GB card, commit {env['commit']}, torch {env['torch']}",
        "",
        f"CPU, shapes only (`python -m benchmarks.kv_capacity`). Card 80e9 bytes less "
        f"{args.reserve_gib} GiB reserve; BF16 KV cache. Requests: prompt {args.prompt}, responses "
        f"lognormal (median {args.median_frac} x budget {args.budget}, sigma {args.sigma}, capped): "
        f"mean request {res['mean_request_tokens']:.0f} tokens; static slot = prompt + budget = "
        f"{res['static_request_tokens']} tokens; a paged request holds "
        f"{res['paged_request_tokens']:.0f} tokens on average ({args.page}-token pages, "
        f"reserved {RESERVE_AHEAD} tokens ahead).",
        "",
        "| model | weights | weights GB | KV GB | KV tokens | requests (by tokens) "
        f"| requests (paged, {args.page}-token pages) "
        "| requests (static batch x max_seq_len) | vs BF16 (paged) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name in MODELS:
        m = res[name]
        base = m["rows"]["bf16"]["requests_paged"]
        for form, r in m["rows"].items():
            ratio = f"{r['requests_paged'] / base:.2f}x" if base else "-"
            lines.append(
                f"| {name} ({m['weights']['layers']} layers, {m['kv_bytes_per_token'] // 1024} KiB "
                f"KV / token) | {FORM_LABEL[form]} | {r['weights_gb']:.1f} | {r['kv_gb']:.1f} | "
                f"{r['kv_tokens']:,} | {r['requests_by_tokens']} | {r['requests_paged']} | "
                f"{r['requests_static']} | {ratio} |"
            )
    lines += [
        "",
        "By tokens is what an ideal slot pool admits (each request its exact length); paged is "
        'what `RolloutEngine(kv_cache="paged", kv_memory_bytes=<KV GB>)` admits (whole pages, '
        'reserved ahead, one scratch page); static is the default `kv_cache="static"` (batch x '
        "max_seq_len, each row sized for the budget). minite's default engine holds the "
        'BF16 parameters beside the packed store; RolloutEngine(weights="packed") holds the NVFP4 '
        "row's bytes (`RolloutEngine.weight_bytes()`).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompt", type=int, default=1024)
    parser.add_argument("--budget", type=int, default=8192, help="max new tokens per request")
    parser.add_argument("--median-frac", type=float, default=0.125)
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--reserve-gib", type=float, default=6.0)
    parser.add_argument("--page", type=int, default=64, help="paged cache: tokens per page")
    args = parser.parse_args()
    if args.prompt < 1 or args.budget < 1 or not 0 < args.median_frac <= 1 or args.sigma <= 0:
        raise ValueError("--prompt, --budget >= 1; 0 < --median-frac <= 1; --sigma > 0")
    if args.page < 1:
        raise ValueError(f"--page must be >= 1, got {args.page}")
    env = environment()
    res = capacity(args)
    text = report(res, args, env)
    print(text)
    write_results("kv_capacity_cpu", {"env": env, "args": vars(args), **res}, text)


if __name__ == "__main__":
    main()
