"""Where does a strict learner/rollout gap come from? Four views of the same teacher-forced token
sequences, compared layer by layer and position by position:

    learner batched | learner alone (each sequence by itself)
    rollout batched | rollout alone  (prefill + decode through the static KV cache)

for a Qwen3-30B-A3B-shaped MoE and a dense Qwen3 of the same width, each through the minite
backend (Inductor) and through the eager lowered graph (same passes, no Inductor). The first
divergent layer / position of each pair says which side, which phase (prefill or decode) and
whether Inductor's code is involved.

    python -m tools.localize_gpu [--tiny] [--batch 8] [--new-tokens 16]

A diagnostic tool: its pass/fail part (the four views agree, bitwise; engine == learner
log-probs) is tests/gpu/test_gpu_alignment.py.
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import environment, write_results
from fp4_compile import NVFP4Recipe
from fp4_compile.backend import lowering_only_backend
from fp4_compile.rl.diagnostics.localize import (
    compare_states,
    learner_hidden_states,
    rollout_hidden_states,
)
from fp4_compile.rollout.step import RolloutStep
from fp4_compile.testing import count_bytes_differ


def _dense(device, layers, tiny):
    from fp4_compile.models import qwen3_30b_a3b_layers, tiny_qwen3

    if tiny:
        return tiny_qwen3(layers=layers, dtype=torch.bfloat16).to(device)
    return qwen3_30b_a3b_layers(layers=layers, device=device, dense=True)


def _moe(device, layers, tiny):
    from fp4_compile.models import qwen3_30b_a3b_layers, tiny_qwen3_moe

    if tiny:
        return tiny_qwen3_moe(layers=layers, dtype=torch.bfloat16).to(device)
    return qwen3_30b_a3b_layers(layers=layers, device=device)


def _per_row(a, b, prompt_lens):
    """For each sequence: (first divergent layer, its first position, 'prefill'/'decode')."""
    rows = []
    for i, p in enumerate(prompt_lens):
        loc = compare_states([a[i]], [b[i]])
        name = loc.first_divergent
        if name is None:
            rows.append(None)
            continue
        gap = next(g for g in loc.layers if g.name == name)
        pos = gap.first_position
        rows.append((name, pos, "prefill" if pos < p else "decode"))
    return rows


def _bits_differ(a: torch.Tensor, b: torch.Tensor) -> int:
    return count_bytes_differ(a.detach().cpu(), b.detach().cpu())


def engine_vs_learner(
    model, recipe, *, batch: int, new_tokens: int, device, localize: bool = False, op_rows=()
) -> list[str]:
    """The sampled path of tests/gpu/test_gpu_alignment.py, instrumented: the logits the engine fed to
    the shared log-prob op at every step, against the learner's logits at the same positions
    (plain graph and hidden-states graph), and the log-probs recomputed from each."""
    import fp4_compile.rollout.engine as engine_module
    from fp4_compile.rl import RolloutEngine
    from fp4_compile.rollout.logprobs import pad_right, token_logprobs

    recorded = []

    def recording(logits, tokens, temperature):
        recorded.append((logits.detach().clone(), tokens.detach().clone()))
        return token_logprobs(logits, tokens, temperature)

    engine = RolloutEngine(model, recipe=recipe, max_batch=256, max_seq_len=128)
    g = torch.Generator().manual_seed(batch)
    vocab = model.config.vocab_size
    prompts = [
        torch.randint(0, vocab, (int(n),), generator=g).tolist()
        for n in torch.randint(4, 64, (batch,), generator=g)
    ]
    engine_module.token_logprobs = recording
    try:
        out = engine.generate(prompts, max_new_tokens=new_tokens, temperature=1.0, seed=0)
    finally:
        engine_module.token_logprobs = token_logprobs
    seqs = [p + t for p, t in zip(prompts, out.tokens)]
    learner = torch.compile(model, backend="minite", options={"recipe": recipe})
    ids, _ = pad_right(seqs, device=device)
    with torch.no_grad():
        plain = learner(input_ids=ids, use_cache=False).logits
        hidden = learner(input_ids=ids, use_cache=False, output_hidden_states=True).logits
    eng_logits = torch.stack([lg for lg, _ in recorded], dim=1)  # [B, new, V]
    learner_plain = torch.stack(
        [plain[i, len(p) - 1 : len(p) - 1 + new_tokens] for i, p in enumerate(prompts)]
    )
    learner_hidden = torch.stack(
        [hidden[i, len(p) - 1 : len(p) - 1 + new_tokens] for i, p in enumerate(prompts)]
    )
    eng_lp = torch.stack(out.logprobs)  # [B, new]
    toks = torch.tensor(out.tokens, device=device)
    lp_plain = token_logprobs(learner_plain, toks, 1.0).cpu()
    lp_from_engine_logits = token_logprobs(eng_logits, toks, 1.0).cpu()
    bad_rows = (eng_logits.float() != learner_plain.float()).any(-1)
    first = [(i, int(bad_rows[i].nonzero()[0, 0])) for i in range(batch) if bool(bad_rows[i].any())]
    lines = [
        f"## sampled engine vs learner, batch {batch}, {new_tokens} new tokens (S_max 128)",
        "",
        f"- engine logits vs learner logits (plain graph): {_bits_differ(eng_logits, learner_plain)} of {eng_logits.numel()} values differ; (row, first step): {first[:16]}",
        f"- learner plain graph vs hidden-states graph logits: {_bits_differ(learner_plain, learner_hidden)} differ",
        f"- engine log-probs vs learner log-probs: {_bits_differ(eng_lp, lp_plain)} of {eng_lp.numel()} differ",
        f"- engine log-probs vs the op re-run on the engine's own logits: {_bits_differ(eng_lp, lp_from_engine_logits)} differ",
        f"- op on engine logits vs op on learner logits: {_bits_differ(lp_from_engine_logits, lp_plain)} differ",
        "",
    ]
    if localize and first:
        lines += _localize_rows(model, recipe, prompts, seqs, first, eng_logits, device)
    if op_rows:
        for row, position in op_rows:
            torch._dynamo.reset()
            prefill = max(len(prompts[row]), position + 1)
            lines += op_level(model, recipe, seqs[row], prefill, position, device)
    return lines


def _localize_rows(model, recipe, prompts, seqs, bad, eng_logits, device) -> list[str]:
    """The engine's own sequences, teacher-forced, in the four views; per divergent row."""
    plens = [len(p) for p in prompts]
    learner = torch.compile(model, backend="minite", options={"recipe": recipe})
    step = torch.compile(
        RolloutStep(model, return_hidden=True), backend="minite", options={"recipe": recipe}
    )
    rows = [i for i, _ in bad[:4]]
    with torch.no_grad():
        lb = learner_hidden_states(learner, seqs, device=device)
        rb = rollout_hidden_states(step, model, seqs, plens, device=device, max_seq_len=128)
        la = {i: learner_hidden_states(learner, [seqs[i]], device=device)[0] for i in rows}
        ra = {
            i: rollout_hidden_states(
                step, model, [seqs[i]], [plens[i]], device=device, max_seq_len=128
            )[0]
            for i in rows
        }
    out = [
        "### divergent rows, teacher-forced on the engine's tokens (hidden-states graphs, S_max 128)",
        "",
    ]
    for i, first_step in bad[:4]:
        p = plens[i]
        # rollout states cover positions 0..len-1; the engine's logits at step t are position p-1+t
        tf_logits = rb[i][-1][p - 1 : p - 1 + eng_logits.shape[1]]
        out.append(
            f"- row {i} (prompt {p}, engine first differs at step {first_step}): "
            f"teacher-forced rollout logits vs engine logits differ in {_bits_differ(tf_logits, eng_logits[i])} values"
        )
        for left, right, a, b in (
            ("rollout batched", "learner batched", rb[i], lb[i]),
            ("rollout batched", "rollout alone", rb[i], ra[i]),
            ("learner batched", "learner alone", lb[i], la[i]),
            ("rollout alone", "learner alone", ra[i], la[i]),
        ):
            loc = compare_states([a], [b])
            name = loc.first_divergent
            where = "none"
            if name:
                gap = next(g for g in loc.layers if g.name == name)
                where = f"{name} at position {gap.first_position} ({'prefill' if gap.first_position < p else 'decode'}), max {gap.max_abs_diff:.2e}"
            out.append(f"  - {left} vs {right}: {where}")
    print("\n".join(out), flush=True)
    return out + [""]


def bucket_flip_rates(dev) -> list[str]:
    """Each GEMM op on 2048 rows at once (the largest M bucket) vs the same rows in chunks of 1,
    16 and 64 (the small buckets, other MMA shapes): bitwise-differing outputs per op."""
    from fp4_compile import reference as ref
    from fp4_compile.codegen.invariant import api as inv
    from fp4_compile.codegen.nvfp4 import gemm as impl

    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(2048, 2048, device=dev, generator=g).bfloat16()
    recipe = NVFP4Recipe.strict()
    ops = {}
    for name, n in (("bf16 linear lm_head N=8192", 8192), ("bf16 linear router N=128", 128)):
        w = (torch.randn(n, 2048, device=dev, generator=g) * 0.02).bfloat16()
        ops[name] = lambda a, w=w: inv.linear(a, w, out_dtype=torch.float32)
    for name, n in (("nvfp4 linear q_proj N=4096", 4096), ("nvfp4 linear gate_up N=1536", 1536)):
        wq = ref.quantize(torch.randn(n, 2048, device=dev, generator=g) * 0.02, block="16x16")
        args = (wq.codes, wq.block_scales.view(torch.uint8), wq.global_decode, None)
        ops[name] = lambda a, args=args: impl.cuda_linear(a, *args, None, recipe, None)
    lines = ["## GEMM rows: one call on 2048 rows vs chunks (M buckets)", ""]
    lines += [
        "| op | chunk 1 | chunk 16 | chunk 64 | elements |",
        "| --- | --- | --- | --- | --- |",
    ]
    with torch.no_grad():
        for name, op in ops.items():
            full = op(x)
            cells = []
            for chunk in (1, 16, 64):
                rows = 256 if chunk == 1 else 2048  # chunk 1: first 256 rows (launch count)
                parts = torch.cat([op(x[i : i + chunk]) for i in range(0, rows, chunk)])
                cells.append(f"{_bits_differ(parts, full[:rows])}/{parts.numel()}")
            lines.append(f"| {name} | {' | '.join(cells)} | |")
            print(lines[-1], flush=True)
    return lines + [""]


def _capture_backend(recipe, store: list):
    """The lowered graph run eagerly (no Inductor) by an FX interpreter that keeps every
    floating-point node output, keyed by (module path, op, occurrence)."""
    from fp4_compile.passes import run_pipeline
    from fp4_compile.passes.graph_utils import module_path

    def backend(gm, example_inputs, **unused):
        run_pipeline(gm, recipe)
        seen: dict = {}

        class Recorder(torch.fx.Interpreter):
            def run_node(self, n):
                out = super().run_node(n)
                if n.op in ("call_function", "call_method") and isinstance(out, torch.Tensor):
                    key = (module_path(n), str(n.target))
                    seen[key] = seen.get(key, -1) + 1
                    if out.is_floating_point():
                        store.append(((*key, seen[key]), n.name, out.detach().clone()))
                return out

        return lambda *args: Recorder(gm).run(*args)

    return backend


def _position_slice(t: torch.Tensor, length: int, pos: int):
    """t's values at token position `pos`, where the token dim is the one of size `length`."""
    for dim, size in enumerate(t.shape):
        if size == length:
            return t.select(dim, pos)
    return None


def op_level(model, recipe, sequence, prompt_len, position, device) -> list[str]:
    """Learner (full forward) vs rollout prefill, both alone, through the eager lowered graph:
    the first op whose output at `position` differs (ops matched by module path and order)."""
    from fp4_compile.rollout.kv_cache import StaticKVCache

    learner_ops, rollout_ops = [], []
    learner = torch.compile(model, backend=_capture_backend(recipe, learner_ops))
    step = torch.compile(RolloutStep(model), backend=_capture_backend(recipe, rollout_ops))
    cfg = model.config
    cache = StaticKVCache(
        num_layers=cfg.num_hidden_layers,
        batch=1,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_seq_len=128,
        dtype=torch.bfloat16,
        device=device,
    )
    tensors = [t for pair in zip(cache.keys, cache.values) for t in pair]
    ids = torch.tensor([sequence], device=device)
    with torch.no_grad():
        learner(input_ids=ids, use_cache=False)
        pos = torch.arange(prompt_len, device=device)[None]
        step(ids[:, :prompt_len], pos, torch.tensor([prompt_len], device=device), *tensors)
    # RolloutStep holds the causal LM as `.model`: its module paths carry one more "model."
    theirs = {(key[0].removeprefix("model."), *key[1:]): (name, t) for key, name, t in rollout_ops}
    lines = [
        f"### op level: learner vs rollout prefill at position {position} (eager lowered graph)",
        "",
    ]
    shown = 0
    for key, name, t in learner_ops:
        if key not in theirs:
            continue
        a = _position_slice(t, len(sequence), position)
        b = _position_slice(theirs[key][1], prompt_len, position)
        if a is None or b is None or a.shape != b.shape:
            continue
        n = _bits_differ(a, b)
        if n:
            diff = float((a.float() - b.float()).abs().max())
            lines.append(
                f"- DIFFERS: {key[0]} {key[1]} #{key[2]} ({name} / {theirs[key][0]}): {n}/{a.numel()} values, max {diff:.3e}"
            )
            shown += 1
            if shown >= 12:
                break
        elif shown == 0:
            lines.append(f"- equal: {key[0]} {key[1]} #{key[2]}")
    if shown == 0:
        lines.append(f"- no op output differs at position {position} in the eager lowered graph")
    lines = lines[:2] + lines[2:][-40:]
    print("\n".join(lines), flush=True)
    return lines + [""]


def _single_bucket_configs() -> None:
    """Pin ONE tile config per GEMM op for every M (the largest bucket's), in place."""
    from fp4_compile.codegen import configs

    for key, table in list(configs.PINNED.items()):
        configs.PINNED[key] = ((None, table[-1][1]),)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run on tiny models")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--models", default="moe,dense")
    parser.add_argument("--backends", default="inductor,lowered-eager")
    parser.add_argument(
        "--engine-batches", default="64,256", help="sampled-path checks ('' = none)"
    )
    parser.add_argument("--buckets", action="store_true", help="GEMM M-bucket bitwise check")
    parser.add_argument("--rows", action="store_true", help="localize the divergent rows")
    parser.add_argument("--variants", default="pinned M buckets")
    parser.add_argument("--op-rows", default="", help="row:position pairs to localize per op")
    args = parser.parse_args()
    device = "cpu" if args.tiny else "cuda"
    env = environment()
    recipe = NVFP4Recipe.strict()
    results = []
    lines = [
        f"# strict learner/rollout localization on {env['gpu']} (emulated NVFP4, sm_90)",
        f"torch {env['torch']}, triton {env['triton']}, commit {env['commit']}; batch {args.batch}, "
        f"{args.new_tokens} teacher-forced tokens after prompts of 4-63 tokens",
        "",
    ]
    for kind in [k for k in args.models.split(",") if k]:
        for backend_name in args.backends.split(","):
            torch._dynamo.reset()
            model = (_moe if kind == "moe" else _dense)(device, args.layers, args.tiny).eval()
            vocab = model.config.vocab_size
            g = torch.Generator().manual_seed(args.batch)
            plens = [int(n) for n in torch.randint(4, 64, (args.batch,), generator=g)]
            seqs = [
                torch.randint(0, vocab, (p + args.new_tokens,), generator=g).tolist() for p in plens
            ]
            backend = lowering_only_backend(recipe) if backend_name == "lowered-eager" else "minite"
            opts = {} if backend_name == "lowered-eager" else {"options": {"recipe": recipe}}
            learner = torch.compile(model, backend=backend, **opts)
            step = torch.compile(RolloutStep(model, return_hidden=True), backend=backend, **opts)
            t0 = time.perf_counter()
            with torch.no_grad():
                views = {
                    "learner batched": learner_hidden_states(learner, seqs, device=device),
                    "learner alone": [
                        learner_hidden_states(learner, [s], device=device)[0] for s in seqs
                    ],
                    "rollout batched": rollout_hidden_states(
                        step, model, seqs, plens, device=device
                    ),
                    "rollout alone": [
                        rollout_hidden_states(step, model, [s], [p], device=device)[0]
                        for s, p in zip(seqs, plens)
                    ],
                }
            elapsed = time.perf_counter() - t0
            lines.append(f"## {kind} model, {backend_name} ({elapsed:.0f} s)")
            lines.append("")
            lines.append(
                "| pair | first divergent | logits differing | rows differing (layer, pos, phase) |"
            )
            lines.append("| --- | --- | --- | --- |")
            for left, right in (
                ("learner batched", "learner alone"),
                ("rollout batched", "rollout alone"),
                ("rollout alone", "learner alone"),
                ("rollout batched", "learner batched"),
            ):
                loc = compare_states(views[left], views[right])
                rows = _per_row(views[left], views[right], plens)
                logit_gap = loc.layers[-1]
                detail = (
                    "; ".join(
                        f"{i}(p={plens[i]}): {r[0]} @{r[1]} {r[2]}" for i, r in enumerate(rows) if r
                    )
                    or "none"
                )
                results.append(
                    {
                        "model": kind,
                        "backend": backend_name,
                        "pair": f"{left} vs {right}",
                        "first_divergent": loc.first_divergent,
                        "layers": [vars(x) for x in loc.layers],
                        "rows": rows,
                    }
                )
                lines.append(
                    f"| {left} vs {right} | {loc.first_divergent or 'none'} | "
                    f"{logit_gap.num_differing}/{logit_gap.num_elements} (max {logit_gap.max_abs_diff:.2e}) | {detail} |"
                )
                print(lines[-1], flush=True)
            lines.append("")
            del model, learner, step, views
            if device == "cuda":
                torch.cuda.empty_cache()
    if args.buckets and device == "cuda":
        lines += bucket_flip_rates(device)
    for variant in args.variants.split(","):
        if variant == "one config per op":
            _single_bucket_configs()
        for batch in [int(b) for b in args.engine_batches.split(",") if b]:
            torch._dynamo.reset()
            model = _moe(device, args.layers, args.tiny).eval()
            part = engine_vs_learner(
                model,
                recipe,
                batch=batch,
                new_tokens=32,
                device=device,
                localize=args.rows,
                op_rows=[tuple(map(int, r.split(":"))) for r in args.op_rows.split(",") if r],
            )
            part[0] += f", {variant}"
            print("\n".join(part), flush=True)
            lines += part
            del model
    text = "\n".join(lines) + "\n"
    print(text)
    write_results(
        "localize_cpu_smoke" if args.tiny else "localize_h200",
        {"env": env, "args": vars(args), "results": results, "text": text},
        text,
    )


if __name__ == "__main__":
    main()
