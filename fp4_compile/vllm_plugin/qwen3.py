"""`MiniteQwen3ForCausalLM`: vLLM's Qwen3 with the learner's ops end to end ("full").

Shape legend: T tokens of vLLM's flattened step, H hidden, Hq / Hkv query / key-value heads,
D head dim, S a request's keys, V vocabulary.

Registered with vLLM's `ModelRegistry` by `register`; a model folder written with
`write_model_folder(..., full=True)` names it in config.json. The weights, layer modules and
loading are vLLM's Qwen3 (so `load_weights` and the plugin's weight sync work unchanged); the
forward is the learner's computation op for op, on vLLM's flattened step:
- linears and lm_head: the plugin's quantization method (minite's ops);
- RMSNorm (input, post-attention, q/k, final): `fp4_compile` rms_norm; residual adds in the
  model dtype, as transformers adds them;
- rotary: transformers' default rotary (inverse frequencies, rotate-half), eager, with the
  learner's cos / sin ops (`fp4_compile::cos` / `sin`);
- attention: keys and values are written into vLLM's paged KV cache (this model's own layout in
  the cache tensor vLLM allocated: [block, Hkv, slot, K|V]); each request's queries attend to its
  keys read back from its blocks with minite's invariant attention on BF16 q/k/v (the learner's
  lowering casts FP32 to BF16), q_start = its first query's position;
- SwiGLU: `fp4_compile::silu_mul`;
- logits: `compute_logits` returns minite's log-probs of EVERY token at the engine's temperature
  (`full_logprobs`: the shared log-prob op's arithmetic, row by row). vLLM then samples with
  temperature 1 from them (softmax of log-probs = softmax of logits / T) and, with
  logprobs_mode="raw_logits", reports the sampled token's value: minite's log-prob.
CUDA: the ops dispatch to minite's kernels, but this class reads the CPU backend's KV-cache
layout only (refused otherwise), and `full_logprobs` is the CPU reference's arithmetic, not the
CUDA log-prob kernel's: the full variant is CPU-only, and nothing here has run under vLLM on a GPU
(vLLM is not installable on the lent H200).
"""

from __future__ import annotations

import torch
from vllm.forward_context import get_forward_context
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM

from ..codegen.invariant import fixed_order
from ..codegen.invariant.api import attention, rms_norm
from ..codegen.invariant.reference import VOCAB_BLOCK
from .model_folder import FULL_ARCHITECTURES, TEMPERATURE_KEY

ARCHITECTURE = FULL_ARCHITECTURES["qwen3"]


def full_logprobs(logits_TV: torch.Tensor, temperature: float) -> torch.Tensor:
    """FP32 [T, V]: log-probs of every token, entry v equal bitwise to the shared op's
    `logprobs(logits, v, temperature)` (z = fp32(logits) / T, m = max z, log l = log of the
    fixed-block sum of exp(z - m) from entry 0; logp = (z - m) - log l)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    z = logits_TV.to(torch.float32) / temperature
    zm = z - z.amax(dim=-1, keepdim=True)
    log_l = fixed_order.log(fixed_order.block_sum(fixed_order.exp(zm), VOCAB_BLOCK))
    return zm - log_l[:, None]


def rotary_cos_sin(positions_T: torch.Tensor, head_dim: int, theta: float, dtype):
    """transformers' default rotary: inv_freq = 1 / theta^(arange(0, D, 2) / D); angles =
    inv_freq x position (one rounded product each); cos/sin of [angles, angles] by the ops the
    learner's lowering puts in its graph (`fp4_compile::cos` / `sin`, passes/lower_trig.py)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions_T.device)
    inv_freq = 1.0 / (theta ** (exponents.to(torch.float32) / head_dim))
    freqs = positions_T.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = torch.ops.fp4_compile.cos(emb), torch.ops.fp4_compile.sin(emb)  # the learner's ops
    return cos.to(dtype), sin.to(dtype)


def apply_rotary(x_THD: torch.Tensor, cos_TD: torch.Tensor, sin_TD: torch.Tensor):
    half = x_THD.shape[-1] // 2
    rotated = torch.cat((-x_THD[..., half:], x_THD[..., :half]), dim=-1)
    return (x_THD * cos_TD[:, None, :]) + (rotated * sin_TD[:, None, :])


def norm(module, x: torch.Tensor) -> torch.Tensor:
    return rms_norm(x, module.weight, module.variance_epsilon)


def paged_attention(attn_layer, q_THD, k_THD, v_THD, metadata) -> torch.Tensor:
    """Write k/v into the layer's paged cache at the step's slots, then per request attend to
    its cached keys with the invariant attention. -> [T, Hq*D] in q's dtype."""
    num_tokens, num_heads, head_dim = q_THD.shape
    out = q_THD.new_zeros((num_tokens, num_heads * head_dim))
    if metadata is None:  # vLLM's warm-up and profile runs carry no metadata
        return out
    cache = attn_layer.kv_cache
    if cache.dim() != 4 or cache.shape[-1] != 2 * head_dim:
        raise ValueError(
            f"KV cache of shape {tuple(cache.shape)}: this model reads the CPU backend's layout "
            f"[blocks, kv_heads, block_size, 2 * head_dim={2 * head_dim}] only"
        )
    num_blocks, num_kv_heads, block_size, _ = cache.shape
    n = int(metadata.num_actual_tokens)
    slots = metadata.slot_mapping[:n].long()
    blk, off = slots // block_size, slots % block_size
    cache[blk, :, off, :head_dim] = k_THD[:n].to(cache.dtype)
    cache[blk, :, off, head_dim:] = v_THD[:n].to(cache.dtype)
    starts = metadata.query_start_loc.tolist()
    lengths = metadata.seq_lens.tolist()
    for b, seq_len in enumerate(lengths):
        s, e = starts[b], starts[b + 1]
        if e == s:
            continue
        blocks = metadata.block_table[b, : -(-seq_len // block_size)].long()
        kv = cache[blocks].permute(1, 0, 2, 3).reshape(num_kv_heads, -1, 2 * head_dim)
        k = kv[None, :, :seq_len, :head_dim].to(torch.bfloat16)
        v = kv[None, :, :seq_len, head_dim:].to(torch.bfloat16)
        q = q_THD[s:e].transpose(0, 1)[None].to(torch.bfloat16).contiguous()
        q_start = torch.tensor([seq_len - (e - s)], dtype=torch.long, device=q.device)
        kv_len = torch.tensor([seq_len], dtype=torch.long, device=q.device)
        o = attention(q, k, v, q_start=q_start, kv_len=kv_len)
        out[s:e] = o[0].transpose(0, 1).reshape(e - s, -1).to(out.dtype)
    return out


class MiniteQwen3ForCausalLM(Qwen3ForCausalLM):
    """vLLM's Qwen3 whose forward is the learner's (module docstring)."""

    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        self.read_config(vllm_config.model_config.hf_config)

    def read_config(self, config) -> None:
        """The log-prob temperature and the rotary base from the model folder's config."""
        self.minite_temperature = float(getattr(config, TEMPERATURE_KEY, 1.0))
        rope = getattr(config, "rope_parameters", None) or {}
        self.minite_rope_theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 1e6)))
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"{ARCHITECTURE} supports the default rotary only, got {rope}")

    def forward(
        self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs
    ):
        h = inputs_embeds if inputs_embeds is not None else self.model.embed_tokens(input_ids)
        context = get_forward_context().attn_metadata
        first = self.model.layers[self.model.start_layer].self_attn
        cos, sin = rotary_cos_sin(positions, first.head_dim, self.minite_rope_theta, h.dtype)
        for layer in self.model.layers[self.model.start_layer : self.model.end_layer]:
            h = h + self.attention_block(
                layer.self_attn, norm(layer.input_layernorm, h), cos, sin, context
            )
            h = h + self.mlp_block(layer.mlp, norm(layer.post_attention_layernorm, h))
        return norm(self.model.norm, h)

    def mlp_block(self, mlp, x):
        """The gated MLP: gate_up GEMM, `fp4_compile::silu_mul`, down GEMM."""
        gate_up, _ = mlp.gate_up_proj(x)
        gate, up = (t.contiguous() for t in gate_up.chunk(2, dim=-1))
        down, _ = mlp.down_proj(torch.ops.fp4_compile.silu_mul(gate, up))
        return down

    def attention_block(self, attn, x, cos, sin, context):
        qkv, _ = attn.qkv_proj(x)
        q, k, v = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
        t, d = q.shape[0], attn.head_dim
        q = apply_rotary(norm(attn.q_norm, q.reshape(t, -1, d)), cos, sin)
        k = apply_rotary(norm(attn.k_norm, k.reshape(t, -1, d)), cos, sin)
        metadata = None if context is None else context[attn.attn.layer_name]
        out = paged_attention(attn.attn, q, k, v.reshape(t, -1, d), metadata)
        o, _ = attn.o_proj(out)
        return o

    def compute_logits(self, hidden_states: torch.Tensor):
        logits = self.logits_processor(self.lm_head, hidden_states)
        return full_logprobs(logits, self.minite_temperature)
