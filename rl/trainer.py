"""The GRPO loop: rollout groups from the embedded engine, verifier rewards, group-normalized
advantages, the learner (the model compiled with backend="minite") recomputing the sequence
log-probs, the clipped loss, AdamW on FP32 master weights, then `engine.update_weights`.

Shape legend: P prompts per step, G samples per prompt, N = P*G sequences, W the fixed sequence
width (longest prompt + max new tokens; every batch is padded to it, so the compiled learner
sees ONE shape and compiles once), T = W - 1 target positions.

Every step logs reward, the learner/rollout mismatch (`rl.diagnostics` names), the rollout
correction's effect, tokens/s of rollout and learner and the step time. Device-side metrics are
gathered into one tensor and synced once per step.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import torch

from ..sr_stream import set_sr_state, sr_state
from .checkpoint import (
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    rng_state,
    save_checkpoint,
    set_rng_state,
    step_path,
)
from .config import TrainConfig, build_model, derive_seed
from .diagnostics import mismatch_tensors
from .engine import RolloutEngine
from .grpo import group_advantages, policy_loss, rollout_correction
from .logprobs import token_logprobs
from .tasks import make_task
from .tokenizer import CharTokenizer
from .warm_start import load_or_warm_start


def _compile(model, recipe):
    from ..compile_api import compile as minite_compile

    return minite_compile(model, recipe=recipe, dynamic=False)


class GRPOTrainer:
    """trainer = GRPOTrainer(cfg); record = trainer.train_step()  (or `train(cfg)` for a run).

    `resume_from`: a step checkpoint to continue from (the warm start is then skipped: the
    checkpoint holds the weights)."""

    def __init__(self, cfg: TrainConfig, *, resume_from: str | Path | None = None, log=print):
        self.cfg, self.log = cfg, log
        self.recipe = cfg.recipe()
        self.device = cfg.torch_device()
        self.tok = CharTokenizer()
        self.task = make_task(
            cfg.task, num_digits=cfg.num_digits, partial_credit=cfg.partial_credit
        )
        self.num_seqs = cfg.prompts_per_step * cfg.group_size
        self.max_new_tokens = self.task.max_answer_chars + 1  # the answer and its EOS
        self.width = 1 + self.task.max_prompt_chars + self.max_new_tokens
        self.model = build_model(cfg, self.tok.padded_vocab_size(16))
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
            weight_decay=cfg.weight_decay,
        )  # fmt: skip
        self.step = 0
        self.warm_start: dict = {}
        state = None
        if resume_from is not None:
            state = load_checkpoint(resume_from, kind="grpo", expect=self._identity())
            self.model.load_state_dict(state["model"])
        else:
            self.warm_start = load_or_warm_start(self.model, cfg, self.task, self.tok, log=log)
        self.ref_model = None
        if cfg.kl_coef > 0:  # the reference policy is the warm-started model
            ref = copy.deepcopy(self.model)
            if state is not None:
                ref.load_state_dict(state["ref_model"])
            self.ref_model = ref.requires_grad_(False)
        # The stochastic-rounding streams of the NVFP4 backward are a per-call-site counter
        # (fp4_compile.sr_stream): part of the run's state, saved and restored with it.
        set_sr_state(state.get("sr_state") if state is not None else None)
        if state is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            self.step = state["step"]
            set_rng_state(state["rng"])
        # The engine owns its own copy of the weights (as a separate rollout would) and gets the
        # learner's after every optimizer step.
        self.engine = RolloutEngine(
            copy.deepcopy(self.model), recipe=self.recipe, device=self.device,
            max_batch=self.num_seqs, max_seq_len=self.width, compile=cfg.compile,
        )  # fmt: skip
        self.learner = _compile(self.model, self.recipe) if cfg.compile else self.model
        self.ref = None
        if self.ref_model is not None:
            self.ref = _compile(self.ref_model, self.recipe) if cfg.compile else self.ref_model

    # ---- checkpoints ---------------------------------------------------------------------
    def _identity(self) -> dict:
        return {"fingerprint": self.recipe.fingerprint(), "numerics": self.cfg.numerics_dict()}

    def state_dict(self) -> dict:
        state = {
            "step": self.step,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "rng": rng_state(),
            "sr_state": sr_state(),
            "recipe": self.recipe.to_dict(),
            "config": self.cfg.to_dict(),
            "tokenizer": self.tok.to_dict(),
            **self._identity(),
        }
        if self.ref_model is not None:
            state["ref_model"] = self.ref_model.state_dict()
        return state

    def save(self, folder: str | Path) -> Path:
        path = save_checkpoint(step_path(folder, self.step), self.state_dict(), kind="grpo")
        prune_checkpoints(folder, keep=self.cfg.keep_checkpoints)
        return path

    # ---- one step ------------------------------------------------------------------------
    def _pack(
        self, prompts: list[list[int]], out
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> ids [N, W] (prompt, generated tokens, pad), mask [N, T] of generated targets,
        rollout log-probs [N, T] aligned with the targets."""
        n, w = len(prompts), self.width
        ids = torch.full((n, w), self.tok.pad_id, dtype=torch.long)
        mask = torch.zeros((n, w - 1), dtype=torch.float32)
        rollout_logp = torch.zeros((n, w - 1), dtype=torch.float32)
        for i, (p, gen, lp) in enumerate(zip(prompts, out.tokens, out.logprobs)):
            seq = p + gen
            ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            mask[i, len(p) - 1 : len(seq) - 1] = 1.0
            rollout_logp[i, len(p) - 1 : len(seq) - 1] = lp
        return ids.to(self.device), mask.to(self.device), rollout_logp.to(self.device)

    def _logprobs(self, model, ids_NW: torch.Tensor) -> torch.Tensor:
        """The learner's sequence log-probs: ONE forward over the whole padded batch, then the
        shared log-prob op at every target position -> [N, T] FP32 (as `sequence_logprobs`)."""
        logits = model(input_ids=ids_NW, use_cache=False).logits
        return token_logprobs(logits[:, :-1], ids_NW[:, 1:], self.cfg.temperature)

    def train_step(self) -> dict:
        cfg, tok, step = self.cfg, self.tok, self.step
        group = cfg.group_size
        t_start = time.perf_counter()
        problems = self.task.problems(
            cfg.prompts_per_step, seed=derive_seed(cfg.seed, "prompts", step)
        )
        prompts = [tok.encode(p.prompt) for p in problems for _ in range(group)]
        seeds = [derive_seed(cfg.seed, "sample", step, i) for i in range(self.num_seqs)]
        out = self.engine.generate(
            prompts, max_new_tokens=self.max_new_tokens, temperature=cfg.temperature, seed=seeds,
            eos_token_id=tok.eos_id,
        )  # fmt: skip
        t_rollout = time.perf_counter() - t_start
        completions = [tok.decode(t) for t in out.tokens]
        rewards = [self.task.reward(problems[i // group], c) for i, c in enumerate(completions)]
        exact = [float(c == problems[i // group].answer) for i, c in enumerate(completions)]

        t_learn = time.perf_counter()
        ids, mask, rollout_logp = self._pack(prompts, out)
        rewards_N = torch.tensor(rewards, dtype=torch.float32, device=self.device)
        adv = group_advantages(rewards_N, group_size=group, scale=cfg.advantage_scale)
        dev: dict[str, torch.Tensor] = {}
        for update in range(cfg.updates_per_batch):
            logp = self._logprobs(self.learner, ids)
            if update == 0:
                old_logp = logp.detach()
                dev.update(mismatch_tensors(old_logp.contiguous(), rollout_logp, mask))
                is_weight, keep, corr = rollout_correction(
                    old_logp, rollout_logp, mask, tis_cap=cfg.tis_cap,
                    mis_token_bounds=cfg.mis_token_bounds, mis_seq_bounds=cfg.mis_seq_bounds,
                )  # fmt: skip
                dev.update(corr)
                ref_logp = None
                if self.ref is not None:
                    with torch.no_grad():
                        ref_logp = self._logprobs(self.ref, ids)
            loss, stats = policy_loss(
                logp, old_logp, adv, keep, clip_low=cfg.clip_low, clip_high=cfg.clip_high,
                aggregation=cfg.aggregation, is_weight=is_weight, ref_logp=ref_logp,
                kl_coef=cfg.kl_coef,
            )  # fmt: skip
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
            self.optimizer.step()
        dev.update(stats)
        dev["grad/norm"] = grad_norm
        self.engine.update_weights(self.model)
        names = sorted(dev)
        values = torch.stack(
            [dev[k].detach().reshape(()).double() for k in names]
        ).tolist()  # the sync
        t_end = time.perf_counter()

        gen_tokens = sum(len(t) for t in out.tokens)
        real_tokens = sum(len(p) for p in prompts) + gen_tokens
        record = {"step": step}
        record["reward/mean"] = sum(rewards) / len(rewards)
        record["reward/exact_frac"] = sum(exact) / len(exact)
        for name in sorted({p.task for p in problems}):
            idx = [i for i in range(self.num_seqs) if problems[i // group].task == name]
            record[f"reward/{name}"] = sum(rewards[i] for i in idx) / len(idx)
        record["rollout/mean_new_tokens"] = gen_tokens / self.num_seqs
        record["rollout/eos_frac"] = out.finish_reasons.count("eos") / self.num_seqs
        record.update(zip(names, values))
        record["perf/rollout_s"] = t_rollout
        record["perf/learner_s"] = t_end - t_learn
        record["perf/step_s"] = t_end - t_start
        record["perf/rollout_tokens_per_s"] = gen_tokens / max(t_rollout, 1e-9)
        record["perf/learner_tokens_per_s"] = (
            real_tokens * cfg.updates_per_batch / max(t_end - t_learn, 1e-9)
        )
        record["sample"] = f"{problems[0].prompt}{completions[0]}"
        self.step += 1
        return record


def train(
    cfg: TrainConfig, *, resume: bool = False, fresh: bool = False, progress: bool = True, log=print
) -> dict:
    """A whole run: warm start (cached), `cfg.steps` GRPO steps with checkpoints every
    `cfg.checkpoint_every`, metrics.jsonl, plots and a summary under `cfg.out_dir`.
    Returns {"records", "summary", "plots", "out_dir", "trainer"}."""
    from .train_logging import ProgressBar, RunLogger, summary, write_plots

    out_dir = Path(cfg.out_dir)
    ckpt_dir = out_dir / "checkpoints"
    latest = latest_checkpoint(ckpt_dir)
    if resume and fresh:
        raise ValueError("resume and fresh exclude each other")
    if resume and latest is None:
        raise CheckpointError(f"--resume: no checkpoint under {str(ckpt_dir)!r}")
    if latest is not None and not resume:
        if not fresh:
            raise ValueError(
                f"{str(out_dir)!r} already holds a run (latest {latest.name}); pass --resume to "
                "continue it, --fresh to start over, or out_dir=... for another folder"
            )
        for p in ckpt_dir.glob("step_*.ckpt"):
            p.unlink()
    t0 = time.perf_counter()
    trainer = GRPOTrainer(cfg, resume_from=latest if resume else None, log=log)
    if resume:
        log(f"resumed from {latest} at step {trainer.step}")
    t_setup = time.perf_counter() - t0
    logger = RunLogger(out_dir, resume_step=trainer.step if resume else None, log=log)
    bar = ProgressBar(cfg.steps, start=trainer.step, every=cfg.log_every) if progress else None
    try:
        while trainer.step < cfg.steps:
            record = trainer.train_step()
            logger.log(record)
            if bar is not None:
                bar.update(record["step"], record)
            if trainer.step % cfg.checkpoint_every == 0 or trainer.step == cfg.steps:
                trainer.save(ckpt_dir)
    finally:
        logger.close()
    records = logger.records
    plots = write_plots(records, out_dir) if records else []
    extra = {
        "recipe": f"{cfg.name} / {cfg.variant} (fingerprint {trainer.recipe.fingerprint()})",
        "setup (warm start, build) s": f"{t_setup:.1f}",
        "wall time s": f"{time.perf_counter() - t0:.1f}",
        "out_dir": str(out_dir),
    }
    text = summary(records, title=f"minite train {cfg.name} --variant {cfg.variant}", extra=extra)
    (out_dir / "summary.txt").write_text(text + "\n")
    return {
        "records": records,
        "summary": text,
        "plots": plots,
        "out_dir": out_dir,
        "trainer": trainer,
    }
