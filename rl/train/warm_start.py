"""A short supervised warm start, so a random-init model has a non-zero reward for GRPO to
improve. It is part of the recipe and cached as a checkpoint keyed by everything that decides
its result (model shape, task, warm-start settings, seed, vocabulary), so a second run skips it.

The warm start runs eagerly in FP32 (plain transformers, no minite lowering): it stands for the
pretrained BF16/FP32 checkpoint a real RL run starts from. The RL phase then runs the recipe's
numerics (NVFP4 for strict / te) on these weights. With `model=DIR` it fine-tunes that checkpoint
the same way, teacher-forcing answers after prompts encoded by its own tokenizer and chat
template (the key then holds the directory's identity and the tokenizer's); warm_start_steps=0
skips it.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch

from ...seeds import derive_seed
from ..tasks.builtin import Problem, Task
from ..tasks.tokenizer import Tokenizer
from .checkpoint import load_checkpoint, save_checkpoint
from .config import TrainConfig, model_dir_identity

WARM_START_FIELDS = (
    "arch",
    "hidden",
    "layers",
    "heads",
    "kv_heads",
    "head_dim",
    "intermediate",
    "experts",
    "experts_per_token",
    "moe_intermediate",
    "task",
    "num_digits",
    "warm_start_steps",
    "warm_start_lr",
    "warm_start_batch",
    "seed",
    "device",
)


def warm_start_key(cfg: TrainConfig, tok: Tokenizer) -> str:
    d = {k: getattr(cfg, k) for k in WARM_START_FIELDS}
    d["tokenizer"] = tok.to_dict()
    if cfg.model:
        d["model_dir"] = model_dir_identity(cfg.model)
    blob = json.dumps(d, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def supervised_batch(
    problems: list[Problem], tok: Tokenizer, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> ids [B, W] (encoded prompt, answer, EOS, right-padded) and target mask [B, W-1]: 1
    where the target ids[:, t+1] is an answer token or the EOS."""
    seqs, starts = [], []
    for p in problems:
        prompt = tok.encode_prompt(p.prompt)
        seqs.append(prompt + tok.encode_answer(p.answer))
        starts.append(len(prompt))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tok.pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width - 1), dtype=torch.float32)
    for i, (s, start) in enumerate(zip(seqs, starts)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, start - 1 : len(s) - 1] = 1.0
    return ids.to(device), mask.to(device)


def run_warm_start(model, cfg: TrainConfig, task: Task, tok: Tokenizer, *, log=None) -> list[float]:
    """Teacher-forced cross-entropy on answer tokens; returns the loss of every step (one
    host sync at the end, and one after each of the first two steps when `log` is given: it
    gets their times and the estimate of the whole warm start, its cost being the model's
    size times warm_start_batch times the sequence width)."""
    device = cfg.torch_device()
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.warm_start_lr, weight_decay=0.0)
    losses = []
    start, marks = time.perf_counter(), []
    for step in range(cfg.warm_start_steps):
        problems = task.problems(cfg.warm_start_batch, seed=derive_seed(cfg.seed, "warm", step))
        ids, mask = supervised_batch(problems, tok, device)
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        )
        loss = (nll * mask.reshape(-1)).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
        if log is not None and step < 2 and cfg.warm_start_steps > 2:
            # the first step pays one-time costs (allocations, kernel caches): the estimate
            # is the first step plus the second step's time for each of the rest
            losses[-1].item()  # wait for the step (on CUDA it runs asynchronously)
            marks.append(time.perf_counter() - start)
            if step == 1:
                first_s, second_s = marks[0], marks[1] - marks[0]
                total = first_s + second_s * (cfg.warm_start_steps - 1)
                log(
                    f"warm start: steps 1-2 of {cfg.warm_start_steps} ({ids.shape[0]} sequences "
                    f"x width {ids.shape[1]}) took {first_s:.2f} + {second_s:.2f} s; about "
                    f"{total:.0f} s in all (warm_start_steps=0 skips it)"
                )
    return torch.stack(losses).tolist() if losses else []


def load_or_warm_start(model, cfg: TrainConfig, task: Task, tok: Tokenizer, *, log=print) -> dict:
    """Load the cached warm start for this configuration into `model`, or compute and cache it.
    Returns {"path", "cached", "losses"}."""
    key = warm_start_key(cfg, tok)
    path = Path(cfg.cache_dir) / f"warm_start-{key}.ckpt"
    if cfg.warm_start_steps == 0:
        return {"path": None, "cached": False, "losses": []}
    if path.exists():
        state = load_checkpoint(path, kind="warm_start", expect={"key": key})
        model.load_state_dict(state["model"])
        log(
            f"warm start: loaded {path} ({cfg.warm_start_steps} steps, final loss {state['losses'][-1]:.3f})"
        )
        return {"path": str(path), "cached": True, "losses": state["losses"], "seconds": 0.0}
    log(f"warm start: {cfg.warm_start_steps} supervised steps (FP32, eager), caching to {path}")
    start = time.perf_counter()
    losses = run_warm_start(model, cfg, task, tok, log=log)
    seconds = time.perf_counter() - start
    state = {"key": key, "model": model.state_dict(), "losses": losses, "config": cfg.to_dict()}
    save_checkpoint(path, state, kind="warm_start")
    log(
        f"warm start: loss {losses[0]:.3f} -> {losses[-1]:.3f} in {seconds:.1f} s "
        f"({seconds / cfg.warm_start_steps:.2f} s/step); cached: the next run with these "
        "settings loads it"
    )
    return {"path": str(path), "cached": False, "losses": losses, "seconds": seconds}
