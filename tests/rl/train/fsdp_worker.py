"""One rank of the FSDP2 check (run by tests/rl/train/test_fsdp.py through torchrun, gloo, CPU):
rollout of this rank's GRPO groups, one sharded learner step (strict NVFP4 forward and
backward, SGD with lr 1 so the saved update is the gradient), weights delivered to the rollout, then learner == rollout log-probs."""

import copy
import json
import sys

import torch
import torch.distributed as dist

from fp4_compile import NVFP4Recipe
from fp4_compile.models import tiny_qwen3
from fp4_compile.reference import quantize
from fp4_compile.rl import RolloutEngine
from fp4_compile.rl.train.distributed import (
    full_parameters,
    global_token_count,
    rank_groups,
    shard_model,
)
from fp4_compile.rollout.logprobs import pad_right, token_logprobs

GROUPS, GROUP, NEW = 4, 2, 6


def main(out_path: str, preset: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    recipe = getattr(NVFP4Recipe, preset)()
    model = tiny_qwen3(dtype=torch.float32).eval()
    engine = RolloutEngine(copy.deepcopy(model), recipe=recipe, max_batch=16, max_seq_len=32)
    g = torch.Generator().manual_seed(0)
    prompts_all = [torch.randint(1, 128, (int(n),), generator=g).tolist() for n in (3, 5, 4, 6)]
    mine = rank_groups(GROUPS, rank, world)
    prompts = [prompts_all[i] for i in mine for _ in range(GROUP)]
    seeds = [100 + i * GROUP + j for i in mine for j in range(GROUP)]
    out = engine.generate(prompts, max_new_tokens=NEW, seed=seeds)
    seqs = [p + t for p, t in zip(prompts, out.tokens)]
    adv = torch.tensor([(-1.0) ** j * (1 + i) for i in mine for j in range(GROUP)])

    shard_model(model)
    learner = torch.compile(model, backend="minite", options={"recipe": recipe})
    w0 = full_parameters(model)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)  # the update IS the gradient
    ids, _ = pad_right(seqs)
    logits = learner(input_ids=ids, use_cache=False).logits
    logp = token_logprobs(logits[:, :-1], ids[:, 1:], 1.0)
    mask = torch.zeros_like(logp)
    for i, p in enumerate(prompts):
        mask[i, len(p) - 1 : len(p) - 1 + NEW] = 1.0
    n_global = global_token_count(mask)
    loss = world * -(adv[:, None] * logp * mask).sum() / n_global  # FSDP2 averages over ranks
    loss.backward()
    opt.step()

    engine.update_weights(model)  # gathers the shards
    full = full_parameters(model)
    out2 = engine.generate(prompts, max_new_tokens=NEW, seed=seeds)
    seqs2 = [p + t for p, t in zip(prompts, out2.tokens)]
    ids2, _ = pad_right(seqs2)
    with torch.no_grad():
        logits2 = learner(input_ids=ids2, use_cache=False).logits
    aligned = all(
        torch.equal(
            token_logprobs(
                logits2[i, len(p) - 1 : len(p) - 1 + NEW], ids2[i, len(p) : len(p) + NEW], 1.0
            ),
            out2.logprobs[i],
        )
        for i, p in enumerate(prompts)
    )
    w = full["model.layers.0.self_attn.q_proj.weight"]
    engine_w = engine._params["model.layers.0.self_attn.q_proj.weight"]
    wq, wq_engine = quantize(w, block="16x16"), quantize(engine_w, block="16x16")
    record = {
        "rank": rank,
        "world": world,
        "aligned": aligned,
        "engine_weights_equal_full": all(
            torch.equal(engine._params[n], t) for n, t in full.items()
        ),
        "quantized_bytes_equal": torch.equal(wq.codes, wq_engine.codes)
        and torch.equal(
            wq.block_scales.view(torch.uint8), wq_engine.block_scales.view(torch.uint8)
        ),
        "tokens_first_rollout": out.tokens,
        "groups": mine,
    }
    if rank == 0:
        torch.save({n: (w0[n] - t).clone() for n, t in full.items()}, out_path + ".grads.pt")
    with open(f"{out_path}.rank{rank}.json", "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
