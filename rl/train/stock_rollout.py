"""`StockRolloutEngine`: a rollout that computes the way a stock inference engine does, on the
learner's own NVFP4 weights: the deliberate learner/rollout mismatch of the alignment ablation
(`rollout_engine="stock"`, `python -m benchmarks.alignment_ablation`, docs/alignment.md).

What it computes (and what is different from minite's learner, which runs the `strict` recipe:
W4A4 with per-row activation scales, batch-invariant kernels, FP32 accumulation):

- weights: the learner's NVFP4 bytes, exactly as `minite export` writes them for vLLM / SGLang
  (`fp4_compile.checkpoints.plan_export`: 16x16 tiles, shared q/k/v and gate/up global scales),
  decoded (`decode_weight`: E2M1 x E4M3 x global decode scale, bitwise `dequantize` of the
  learner's quantized weight) and stored in BF16 (the serving dtype). The SAME weights.
- activations: NOT quantized (W4A16). This is what vLLM runs for an NVFP4 checkpoint on Hopper
  (Marlin W4A16, FIELD_NOTES) and what the export's own note says a stock engine will do with
  minite's checkpoint; the learner quantizes every linear's input to NVFP4 (per-row scales).
- everything else in BF16 through plain eager transformers ops (RMSNorm, rotary, SDPA attention,
  SiLU, residual adds; the embedding and lm_head in BF16), with an incremental KV cache (one
  token per decode step: other GEMM shapes and reduction orders than the learner's one
  full-sequence forward), and left-padded batches (attention masks, as `generate` does).
- log-probs: `log_softmax(logits.float() / T)` of the BF16 logits (stock torch ops, not the
  shared batch-invariant op).

Sampling uses minite's seeded Gumbel stream (`fp4_compile.rollout.sampling`), so a request's
noise is the same as in the minite engine: only the numerics differ, not the random draws.
"""

from __future__ import annotations

import copy
import inspect

import torch

from ...checkpoints.load import decode_weight
from ...checkpoints.plan import plan_export, split_expert_name
from ...engine_api import RolloutOutput, check_generate_args
from ...recipe import NVFP4Recipe, as_recipe
from ...rollout.sampling import gumbel_noise, request_keys, sample


class StockRolloutEngine:
    """engine = StockRolloutEngine(model, recipe=NVFP4Recipe.strict()); engine.generate(...).

    The rollout engines' interface (`fp4_compile.engine_api.RolloutEngineProtocol`):
    `generate` over any number of requests (static batches of max_batch), `update_weights`.
    `recipe` decides which linears hold NVFP4 weights (the learner's own choice per module);
    with a recipe that quantizes nothing (`bf16`) the engine is a plain BF16 eager model."""

    def __init__(
        self,
        model: torch.nn.Module,
        *,
        recipe: NVFP4Recipe | dict | None = None,
        device=None,
        max_batch: int = 64,
        max_seq_len: int = 512,
        dtype: torch.dtype = torch.bfloat16,
    ):
        src = getattr(model, "_orig_mod", model)
        self.recipe = as_recipe(recipe)
        self.device = torch.device(device) if device is not None else next(src.parameters()).device
        self.max_batch, self.max_seq_len, self.dtype = max_batch, max_seq_len, dtype
        self.model = copy.deepcopy(src).to(device=self.device, dtype=dtype).eval()
        self.model.requires_grad_(False)
        cfg = getattr(self.model.config, "text_config", None) or self.model.config
        self.vocab_size = cfg.vocab_size
        # transformers >= 5.25 names the KV cache argument `cache` (`past_key_values` before)
        params = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self.update_weights(src)

    @torch.no_grad()
    def update_weights(self, model: torch.nn.Module) -> None:
        """The learner's weights as a stock engine loads minite's NVFP4 export: every linear the
        recipe quantizes decoded from the learner's bytes, everything else as it is, in BF16."""
        src = getattr(model, "_orig_mod", model)
        plan = plan_export(src, self.recipe) if self.recipe.quantize else None
        decoded = {}
        experts: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
        if plan is not None:
            for q in plan.quantized:
                # decoded where the engine runs (exact E2M1 x E4M3, one FP32 rounding: the
                # same bits on any device)
                w = decode_weight(
                    *(t.to(self.device) for t in (q.codes, q.block_scales, q.global_decode))
                )
                split = split_expert_name(q.name)
                if split is None:
                    decoded[f"{q.name}.weight"] = w
                else:  # an expert of a fused MoE tensor: fused back below, as an engine loads it
                    path, e, proj = split
                    experts.setdefault(path, {}).setdefault(e, {})[proj] = w
        for path, by_expert in experts.items():
            ids = sorted(by_expert)
            gate_up = [torch.cat([by_expert[e]["gate_proj"], by_expert[e]["up_proj"]]) for e in ids]
            decoded[f"{path}.gate_up_proj"] = torch.stack(gate_up)
            decoded[f"{path}.down_proj"] = torch.stack([by_expert[e]["down_proj"] for e in ids])
        mine = dict(self.model.named_parameters())
        for name, p in src.named_parameters():
            value = decoded.get(name, p.detach())
            mine[name].copy_(value.to(device=self.device, dtype=self.dtype))
        self.num_nvfp4_linears = len(decoded)

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: int | list[int],
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | list[int] = 0,
        eos_token_id: int | None = None,
    ) -> RolloutOutput:
        """As `RolloutEngine.generate` (any number of prompts; temperature 0: greedy, log-probs
        of the unscaled logits); top_k / top_p are not supported (the ablation samples the full
        distribution).

        Static batching, as a stock `generate` batches: the requests run in waves of max_batch
        (in order), each wave left-padded to its longest prompt and decoded until all its rows
        end; unlike the embedded engine's continuous batching, a request's numbers depend on
        the wave it falls in (its padding and batch shape)."""
        args = check_generate_args(
            prompts,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            vocab_size=self.vocab_size,
            max_seq_len=self.max_seq_len,
            no_filter_reason="StockRolloutEngine samples the full distribution",
        )
        keys = request_keys(args.seeds, self.device)
        out = RolloutOutput(tokens=[], logprobs=[], finish_reasons=[])
        for start in range(0, len(prompts), self.max_batch):
            wave = slice(start, start + self.max_batch)
            part = self._generate_wave(
                prompts[wave], args.budgets[wave], keys[wave], temperature, eos_token_id
            )
            out.tokens += part.tokens
            out.logprobs += part.logprobs
            out.finish_reasons += part.finish_reasons
        return out

    def _generate_wave(
        self, prompts, budgets: list[int], keys_B, temperature: float, eos_token_id: int | None
    ) -> RolloutOutput:
        """One static batch of at most max_batch requests: a left-padded prefill, then one token
        for every row per step until every row has met its EOS or its budget."""
        # lazy: transformers is optional (the hf extra) and costs seconds at import
        from transformers import DynamicCache

        num, greedy, max_new_tokens = len(prompts), temperature == 0, max(budgets)
        width = max(len(p) for p in prompts)
        # left padding, as transformers' generate batches prompts of different lengths
        ids = torch.zeros((num, width), dtype=torch.long)
        attn = torch.zeros((num, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            attn[i, width - len(p) :] = 1
        ids, attn = ids.to(self.device), attn.to(self.device)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        out = self.model(
            input_ids=ids,
            attention_mask=attn,
            position_ids=positions,
            use_cache=True,
            **{self._cache_arg: cache},
        )
        last = out.logits[:, -1]
        pos = positions[:, -1]
        tokens_BN = torch.zeros((num, max_new_tokens), dtype=torch.long, device=self.device)
        logps_BN = torch.zeros((num, max_new_tokens), dtype=torch.float32, device=self.device)
        finished = torch.zeros(num, dtype=torch.bool, device=self.device)
        budgets_B = torch.tensor(budgets, device=self.device)
        steps = max_new_tokens
        for step in range(max_new_tokens):
            logits = last.float()
            if greedy:
                picked = torch.argmax(logits, dim=-1)
                logp_all = torch.log_softmax(logits, dim=-1)
            else:
                scaled = logits / temperature
                picked = sample(scaled, gumbel_noise(keys_B, step, self.vocab_size))
                logp_all = torch.log_softmax(scaled, dim=-1)
            logps_BN[:, step] = logp_all.gather(1, picked[:, None])[:, 0]
            tokens_BN[:, step] = picked
            if eos_token_id is not None:
                finished |= (picked == eos_token_id) | (budgets_B <= step + 1)
                if bool(finished.all()):
                    steps = step + 1
                    break
            if step == max_new_tokens - 1:
                break
            attn = torch.cat([attn, torch.ones((num, 1), dtype=attn.dtype, device=self.device)], 1)
            pos = pos + 1
            out = self.model(
                input_ids=picked[:, None],
                attention_mask=attn,
                position_ids=pos[:, None],
                use_cache=True,
                **{self._cache_arg: cache},
            )
            last = out.logits[:, -1]
        tokens_all, logps_all = tokens_BN[:, :steps].cpu(), logps_BN[:, :steps].cpu()
        tokens, logps, reasons = [], [], []
        for i in range(num):
            row = tokens_all[i, : budgets[i]]
            n, reason = len(row), "length"
            if eos_token_id is not None:
                hits = (row == eos_token_id).nonzero()
                if len(hits):
                    n, reason = int(hits[0]) + 1, "eos"
            tokens.append(row[:n].tolist())
            logps.append(logps_all[i, :n].clone())
            reasons.append(reason)
        return RolloutOutput(tokens=tokens, logprobs=logps, finish_reasons=reasons)
