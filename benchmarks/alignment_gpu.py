"""Learner == rollout on the GPU: Qwen3-30B-A3B-shaped decoder layers (random init, vocab
reduced), strict recipe, batch sizes up to 256, mixed prompt lengths: engine log-probs vs the
learner's sequence log-probs, bitwise; te's gap measured the same way (reported, not hidden).

    python -m benchmarks.alignment_gpu [--layers 2] [--new-tokens 32]
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import environment, write_results
from fp4_compile import NVFP4Recipe
from fp4_compile.models import qwen3_30b_a3b_layers, tiny_qwen3_moe
from fp4_compile.rl import RolloutEngine, sequence_logprobs
from fp4_compile.rl.diagnostics import mismatch_metrics, pack_ragged


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--batches", default="1,8,64,256")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run on a tiny model")
    parser.add_argument("--variants", default="strict,te", help="recipes, comma-separated")
    parser.add_argument(
        "--cuda-graphs", action="store_true", help="the engine decodes with CUDA graphs"
    )
    args = parser.parse_args()
    device = "cpu" if args.tiny else "cuda"
    env = environment()
    rows = []
    presets = {"strict": NVFP4Recipe.strict(), "te": NVFP4Recipe.te()}
    for variant in args.variants.split(","):
        recipe = presets[variant]
        torch._dynamo.reset()
        model = (
            tiny_qwen3_moe(layers=2, dtype=torch.bfloat16)
            if args.tiny
            else qwen3_30b_a3b_layers(layers=args.layers, device=device)
        ).eval()
        vocab = model.config.vocab_size
        engine = RolloutEngine(
            model, recipe=recipe, max_batch=256, max_seq_len=128, cuda_graphs=args.cuda_graphs
        )
        learner = torch.compile(model, backend="minite", options={"recipe": recipe})
        for batch in [int(b) for b in args.batches.split(",")]:
            g = torch.Generator().manual_seed(batch)
            prompts = [
                torch.randint(0, vocab, (int(n),), generator=g).tolist()
                for n in torch.randint(4, 64, (batch,), generator=g)
            ]
            t0 = time.perf_counter()
            try:
                out = engine.generate(
                    prompts, max_new_tokens=args.new_tokens, temperature=1.0, seed=0
                )
                t1 = time.perf_counter()
                with torch.no_grad():
                    train = sequence_logprobs(
                        learner,
                        [p + t for p, t in zip(prompts, out.tokens)],
                        [len(p) for p in prompts],
                        temperature=1.0,
                    )
            except Exception as e:  # recorded, not hidden
                rows.append(
                    {"variant": variant, "batch": batch, "error": f"{type(e).__name__}: {e}"[:2000]}
                )
                print(rows[-1], flush=True)
                continue
            lt, mask = pack_ragged([t.cpu() for t in train])
            lr, _ = pack_ragged(out.logprobs)
            m = mismatch_metrics(lt, lr, mask)
            rows.append(
                {
                    "variant": variant,
                    "batch": batch,
                    "generate_s": t1 - t0,
                    "frac_bitwise_equal": m["mismatch/frac_bitwise_equal"],
                    "max_abs_dlogp": m["mismatch/max_abs_dlogp"],
                    "kl": m["rollout_corr/kl"],
                    "token_mult_prob_error": m["token_mult_prob_error"],
                }
            )
            print(rows[-1], flush=True)
        del model, engine, learner
        if device == "cuda":
            torch.cuda.empty_cache()
    md = [
        f"# learner vs rollout log-probs on {env['gpu']} (emulated NVFP4, sm_90)",
        f"torch {env['torch']}, triton {env['triton']}, commit {env['commit']}; Qwen3-30B-A3B-shaped, "
        f"{args.layers} layers, vocab 8192, {args.new_tokens} new tokens, prompts 4-63 tokens; "
        f"engine decode {'with CUDA graphs' if args.cuda_graphs else 'without CUDA graphs'}",
        "",
        "| recipe | batch | bitwise-equal tokens | max abs dlogp | kl | token_mult_prob_error |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            md.append(f"| {r['variant']} | {r['batch']} | ERROR: {r['error'][:200]} | | | |")
            continue
        md.append(
            f"| {r['variant']} | {r['batch']} | {r['frac_bitwise_equal']:.4f} | {r['max_abs_dlogp']:.3e} | "
            f"{r['kl']:.3e} | {r['token_mult_prob_error']:.6f} |"
        )
    text = "\n".join(md) + "\n"
    print(text)
    write_results(
        "alignment_cpu_smoke" if args.tiny else "alignment_h200",
        {"env": env, "args": vars(args), "rows": rows},
        text,
    )


if __name__ == "__main__":
    main()
