"""Random small models for the property tests of the lowering: stacks of Linear, RMSNorm
(written as transformers writes it), causal attention (SDPA) and MoE blocks (transformers'
Qwen3-MoE sparse block), with random legal sizes. Deterministic from a seed."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F


class HFStyleRMSNorm(torch.nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(1.0 + 0.1 * torch.randn(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x32 = x.to(torch.float32)
        var = x32.pow(2).mean(-1, keepdim=True)
        return self.weight * (x32 * torch.rsqrt(var + self.eps)).to(dtype)


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.qkv = torch.nn.Linear(dim, 3 * heads * head_dim, bias=False)
        self.out = torch.nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, -1))


class MoEBlock(torch.nn.Module):
    def __init__(self, dim: int, experts: int, inter: int, top_k: int):
        super().__init__()
        from transformers import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        cfg = Qwen3MoeConfig(
            hidden_size=dim,
            moe_intermediate_size=inter,
            num_experts=experts,
            num_experts_per_tok=top_k,
            norm_topk_prob=True,
        )
        cfg._experts_implementation = "grouped_mm"
        self.mlp = Qwen3MoeSparseMoeBlock(cfg)
        with torch.no_grad():
            for p in self.mlp.parameters():
                p.normal_(0, 0.05)

    def forward(self, x):
        return self.mlp(x)


class RandomStack(torch.nn.Module):
    def __init__(self, dim: int, kinds: list[str], *, seed: int):
        super().__init__()
        rng = random.Random(seed)
        blocks = []
        for kind in kinds:
            if kind == "linear":
                blocks.append(torch.nn.Linear(dim, dim, bias=rng.random() < 0.5))
            elif kind == "norm":
                blocks.append(HFStyleRMSNorm(dim))
            elif kind == "attention":
                blocks.append(
                    CausalSelfAttention(
                        dim, heads=rng.choice([1, 2]), head_dim=rng.choice([16, 32])
                    )
                )
            elif kind == "moe":
                blocks.append(
                    MoEBlock(
                        dim,
                        experts=rng.choice([2, 4]),
                        inter=rng.choice([16, 32]),
                        top_k=rng.choice([1, 2]),
                    )
                )
            else:
                raise ValueError(f"unknown block kind {kind!r}")
        self.blocks = torch.nn.ModuleList(blocks)
        self.kinds = list(kinds)

    def forward(self, x):
        for kind, block in zip(self.kinds, self.blocks):
            x = x + block(x) if kind in ("attention", "moe") else block(x)
        return x


def random_stack(seed: int, *, max_blocks: int = 4) -> tuple[RandomStack, int]:
    rng = random.Random(seed)
    dim = rng.choice([32, 48, 64])
    kinds = [
        rng.choice(["linear", "norm", "attention", "moe"])
        for _ in range(rng.randint(1, max_blocks))
    ]
    torch.manual_seed(seed)
    return RandomStack(dim, kinds, seed=seed), dim
