"""`minite diagnose`: how far apart are rollout and learner log-probs, for stock transformers and
for minite (strict and te), on the same model and prompts? Prints one side-by-side table, writes
JSON and a PNG histogram of |dlogp|.

Stock transformers: `generate` (KV cache, incremental) vs one full forward of the sampled
sequences, both BF16, log-probs from log_softmax(logits / T). minite: RolloutEngine vs
sequence_logprobs through the same lowering.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from ...model_dir import check_model_dir
from ...models import TINY, build_causal_lm
from ...recipe import NVFP4Recipe
from ...rollout import RolloutEngine, sequence_logprobs
from ...run_folders import numbered_run_dirs
from ...weight_policy import layer_patterns, shape_fallbacks
from .mismatch import METRIC_NAMES, mismatch_metrics, pack_ragged

# metric -> what a perfect pair of engines shows (the legend printed under the table)
SHOWN = {
    "mismatch/frac_bitwise_equal": "1: every token's log-prob bitwise equal",
    "mismatch/max_abs_dlogp": "0",
    "rollout_corr/kl": "0; the k1 estimate mean(logp_rollout - logp_train) can be < 0 by chance",
    "rollout_corr/k3_kl": "0; never < 0",
    "token_mult_prob_error": "1 (not 0); NeMo RL flags > 1.05",
    "training/rollout_probs_diff_max": "0",
    "rollout_corr/rollout_is_eff_sample_size": "1; verl warns below 0.3",
}


def build_model(spec: str, dtype=torch.float32, *, log=None):
    """tiny-qwen3 / tiny-qwen3-moe (random init), a local transformers checkpoint folder (its
    weights; refused, naming the cause, if minite cannot run it: fp4_compile/model_dir.py), or a
    config.json path (random weights of that config: `log` says so)."""
    if spec in TINY:
        return build_causal_lm(spec, dtype=dtype)
    path = Path(spec)
    if not path.exists():
        raise ValueError(
            f"--model must be 'tiny-qwen3', 'tiny-qwen3-moe', a transformers checkpoint folder "
            f"or a config.json path, got {spec!r} (no such file or folder)"
        )
    if path.is_dir():
        # lazy: transformers is optional (the hf extra) and costs seconds at import
        from transformers import AutoModelForCausalLM

        check_model_dir(path)
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype, attn_implementation="sdpa"
        )
        return model.to(dtype)
    if log is not None:
        log(
            f"--model {spec}: random weights of this config (seed 0), not a checkpoint's; pass "
            f"the folder {str(path.parent)!r} to load its weights"
        )
    return build_causal_lm(spec, dtype=dtype)


def _prompts(num: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 16, (num,), generator=g).tolist()
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


@torch.no_grad()
def stock_transformers(model, prompts, *, new_tokens: int, temperature: float, seed: int):
    """Stock HF: generate() per prompt (its own cache path) vs one full forward."""
    model = model.to(torch.bfloat16).eval()
    gen_lp, train_lp = [], []
    for i, p in enumerate(prompts):
        torch.manual_seed(seed + i)
        ids = torch.tensor([p])
        out = model.generate(
            ids,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        new = out.sequences[0, len(p) :]
        logits = torch.stack(out.logits, dim=1)[0].float() / temperature
        gen_lp.append(torch.log_softmax(logits, -1).gather(-1, new[:, None])[:, 0])
        full = (
            model(input_ids=out.sequences, use_cache=False).logits[0, len(p) - 1 : -1].float()
            / temperature
        )
        train_lp.append(torch.log_softmax(full, -1).gather(-1, new[:, None])[:, 0])
    return train_lp, gen_lp


@torch.no_grad()
def minite_pair(
    model, prompts, *, recipe: NVFP4Recipe, new_tokens: int, temperature: float, seed: int
):
    engine = RolloutEngine(
        model,
        recipe=recipe,
        max_batch=len(prompts),
        max_seq_len=max(map(len, prompts)) + new_tokens,
    )
    out = engine.generate(prompts, max_new_tokens=new_tokens, temperature=temperature, seed=seed)
    learner = torch.compile(model, backend="minite", options={"recipe": recipe})
    seqs = [p + t for p, t in zip(prompts, out.tokens)]
    train = sequence_logprobs(learner, seqs, [len(p) for p in prompts], temperature=temperature)
    return [t.cpu() for t in train], out.logprobs


def run_diagnose(
    *,
    model: str = "tiny-qwen3",
    batch: int = 8,
    new_tokens: int = 32,
    temperature: float = 1.0,
    seed: int = 0,
    out_dir: str | None = None,
    overwrite: bool = False,
    bf16_modules: tuple[str, ...] = (),
    log=print,
) -> dict:
    """The learner/rollout log-prob gap of one model under minite strict, minite te and stock
    transformers; prints a line as each of the three starts and ends (each minite row compiles
    the engine and the learner). `out_dir` None: a folder of its own (`diagnose_dir`);
    `bf16_modules`: fnmatch patterns of modules kept BF16, added to both recipes' own."""
    out = diagnose_dir(out_dir, overwrite=overwrite)
    log(f"results folder: {out}")
    results = {}
    probe = build_model(model, log=log)
    prompts = _prompts(batch, probe.config.vocab_size, seed)
    recipes = []
    for name, recipe in (("minite strict", NVFP4Recipe.strict()), ("minite te", NVFP4Recipe.te())):
        extra = tuple(p for p in bf16_modules if p not in recipe.bf16_modules)
        recipes.append((name, recipe.with_(bf16_modules=recipe.bf16_modules + extra)))
    check_shapes(probe, recipes[0][1], model=model)
    for i, (name, recipe) in enumerate(recipes, start=1):
        log(f"[{i}/3] {name}: compiling the engine and the learner, generating, scoring ...")
        t0 = time.perf_counter()
        torch._dynamo.reset()
        train, roll = minite_pair(
            build_model(model),
            prompts,
            recipe=recipe,
            new_tokens=new_tokens,
            temperature=temperature,
            seed=seed,
        )
        results[name] = (train, roll)
        log(f"[{i}/3] {name}: done in {time.perf_counter() - t0:.1f} s")
    log("[3/3] transformers bf16: generating and scoring ...")
    t0 = time.perf_counter()
    results["transformers bf16"] = stock_transformers(
        build_model(model), prompts, new_tokens=new_tokens, temperature=temperature, seed=seed
    )
    log(f"[3/3] transformers bf16: done in {time.perf_counter() - t0:.1f} s")
    table = {}
    for name, (train, roll) in results.items():
        lt, mask = pack_ragged(train)
        lr, _ = pack_ragged(roll)
        table[name] = mismatch_metrics(lt, lr, mask)
    out.mkdir(parents=True, exist_ok=True)
    (out / "diagnose.json").write_text(
        json.dumps(
            {
                "model": model,
                "batch": batch,
                "new_tokens": new_tokens,
                "temperature": temperature,
                "metrics": table,
            },
            indent=1,
        )
    )
    _histogram(results, out / "dlogp_hist.png")
    log(format_table(table))
    log(f"wrote {out / 'diagnose.json'} and {out / 'dlogp_hist.png'}")
    return table


def diagnose_dir(out_dir: str | None, *, overwrite: bool = False) -> Path:
    """Where `minite diagnose` writes, decided before any work. None: `runs/diagnose`, or when
    that holds an earlier result the next numbered folder (`runs/diagnose-2`, ...), so a result
    is never replaced silently. A named folder that holds a result is refused unless
    `overwrite`."""
    if out_dir is None:
        base = Path("runs") / "diagnose"
        runs = numbered_run_dirs(base)
        return base.parent / f"{base.name}-{max(runs) + 1}" if runs else base
    out = Path(out_dir)
    if (out / "diagnose.json").exists() and not overwrite:
        raise ValueError(
            f"--out {str(out)!r} already holds a diagnose result ({str(out / 'diagnose.json')!r});"
            " pass --overwrite to replace it, another --out, or leave --out out for a new folder"
        )
    return out


def check_shapes(probe: torch.nn.Module, recipe: NVFP4Recipe, *, model: str) -> None:
    """Refuse, before any compile, a model whose GEMMs the strict recipe cannot quantize (K or N
    not a multiple of 16), naming the modules and `--bf16-modules`."""
    odd = shape_fallbacks(probe, recipe)
    if odd:
        shown = ", ".join(f"{path} (N={n}, K={k})" for path, n, k in odd[:6])
        more = f" and {len(odd) - 6} more" if len(odd) > 6 else ""
        raise ValueError(
            f"--model {model}: {len(odd)} GEMM(s) have K or N not a multiple of 16 and cannot be "
            f"NVFP4 (minite never pads): {shown}{more}; keep them BF16 with --bf16-modules "
            f"'{','.join(layer_patterns([p for p, _, _ in odd]))}'"
        )


def format_table(table: dict[str, dict[str, float]]) -> str:
    names = list(table)
    width = max(len(m) for m in SHOWN)
    lines = ["metric".ljust(width) + "  " + "  ".join(n.rjust(18) for n in names)]
    for m in SHOWN:
        lines.append(m.ljust(width) + "  " + "  ".join(f"{table[n][m]:18.3e}" for n in names))
    assert set(SHOWN) <= set(METRIC_NAMES)
    lines.append("perfect (learner == rollout):")
    lines += [f"  {m.ljust(width)}  {good}" for m, good in SHOWN.items()]
    return "\n".join(lines)


def _histogram(results, path: Path) -> None:
    import matplotlib  # lazy: matplotlib costs ~0.5 s at import; only the plots need it

    matplotlib.use("Agg")
    # lazy: matplotlib costs ~0.5 s at import; only the plots need it
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, (train, roll) in results.items():
        d = torch.cat([(a.double() - b.double()).abs() for a, b in zip(train, roll)])
        d = torch.where(d == 0, torch.full_like(d, 1e-12), d)  # exact zeros drawn at 1e-12
        ax.hist(torch.log10(d).numpy(), bins=50, alpha=0.5, label=name)
    ax.set_xlabel("log10 |logp_train - logp_rollout|  (exact 0 shown at -12)")
    ax.set_ylabel("tokens")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
