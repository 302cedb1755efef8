"""Worker of tests/rl/train/test_fsdp_gradients.py: `torchrun --nproc_per_node=N fsdp_grad_worker.py
OUT MODE` (or plain python for one process). One learner step of a tiny 2-layer Qwen3 on a fixed
batch of 4 sequences, split by rows over the ranks; the loss is each rank's share of the global
token-mean NLL times the world size (FSDP2 averages gradients over ranks), exactly as the GRPO
trainer scales it. MODE "eager": plain FP32 transformers; "compiled": backend "minite" with the
bf16 recipe (the trainer's compiled learner, no quantization). Rank 0 writes the full gradients
to OUT.grads.pt; warnings go to stderr as in a training run."""

import os
import sys

import torch
import torch.distributed as dist

from fp4_compile.models import tiny_qwen3
from fp4_compile.rl.train import distributed as ddp
from fp4_compile.rollout.weight_sync import full_tensor


def main(out: str, mode: str) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if world > 1 else 0
    model = tiny_qwen3(layers=2)
    ids = torch.randint(1, 128, (4, 12), generator=torch.Generator().manual_seed(0))
    local = ids[rank::world]
    if world > 1:
        ddp.shard_model(model)
    learner = model
    if mode == "compiled":
        from fp4_compile import NVFP4Recipe
        from fp4_compile.compile_api import compile as minite_compile

        learner = minite_compile(model, recipe=NVFP4Recipe.bf16(), dynamic=False)
    logits = learner(input_ids=local, use_cache=False).logits
    logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, local[:, 1:, None])
    loss = -logp.sum() / ids[:, 1:].numel()
    (loss * world).backward()
    inner = getattr(model, "_orig_mod", model)
    grads = {n: full_tensor(p.grad).detach().clone() for n, p in inner.named_parameters()}
    if rank == 0:
        torch.save(grads, f"{out}.grads.pt")
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
