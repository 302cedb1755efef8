"""The GRPO loop: rollout groups from the embedded engine, verifier rewards, group-normalized
advantages, the learner (the model compiled with backend="minite") recomputing the sequence
log-probs, the clipped loss, AdamW on FP32 master weights, then `engine.update_weights`.

Shape legend: P prompts per step, G samples per prompt, N = P*G sequences, W the full sequence
width (longest prompt + the response budget `max_new_tokens`, the prompt part from
`tok.token_budget(task)`: the most a sequence can hold, the engine's cache length), W' the
learner's width for this batch (rl/train/batching.py: the longest real sequence, each ending at its own
EOS, rounded up to one of at most 8 fixed width buckets, so the learner compiles at most 8
times and does no work on the padding past the longest sequence), T' = W' - 1 target positions.

The model is a random-init Qwen3 / Qwen3-MoE with the character tokenizer, or (`model=DIR`) a
local transformers checkpoint with its own tokenizer and chat template (rl/tasks/hf_tokenizer.py).

Every step logs reward, the learner/rollout mismatch (`rl.diagnostics` names), the rollout
correction's effect, tokens/s of rollout and learner and the step time. Device-side metrics are
gathered into one tensor and synced once per step. `train` also scores the policy on a fixed
held-out set, greedily (rl/train/evaluation.py): before GRPO, every `eval_every` steps and at the end.
"""

from __future__ import annotations

import copy
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from ...compile_api import compile as minite_compile
from ...dynamo_guard import no_silent_eager_fallback
from ...learner_widths import learner_width, width_buckets
from ...rollout import token_logprobs
from ...rollout.learner_head import (
    DEFAULT_CHUNK_ROWS,
    chunked_head_parts,
    head_token_logprobs,
    learner_hidden,
)
from ...seeds import derive_seed
from ...sr_stream import set_sr_state, sr_state
from ..diagnostics.mismatch import mismatch_tensors
from ..tasks.builtin import make_task
from ..tasks.tokenizer import make_tokenizer
from . import distributed as ddp
from .batching import pack_batch
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
from .config import TrainConfig, build_model, model_dir_identity
from .engines import EngineRequest, build_engine
from .evaluation import evaluate, heldout_problems
from .grpo import group_advantages, policy_loss, rollout_correction
from .run_log import Heartbeat, ProgressBar, RunLogger, summary, write_plots
from .warm_start import load_or_warm_start


def _compile(model, recipe, *, quantize_weights: str = "every_call"):
    return minite_compile(model, recipe=recipe, dynamic=False, quantize_weights=quantize_weights)


class GRPOTrainer:
    """trainer = GRPOTrainer(cfg); record = trainer.train_step()  (or `train(cfg)` for a run).

    `resume_from`: a step checkpoint to continue from (the warm start is then skipped: the
    checkpoint holds the weights)."""

    def __init__(self, cfg: TrainConfig, *, resume_from: str | Path | None = None, log=print):
        self.cfg, self.log = cfg, log
        self.recipe = cfg.recipe()
        self.device = cfg.torch_device()
        self.task = make_task(
            cfg.task, num_digits=cfg.num_digits, partial_credit=cfg.partial_credit
        )
        self.tok = make_tokenizer(cfg.model, self.task, system_prompt=cfg.system_prompt)
        self.rank, self.world = ddp.rank_world()
        if cfg.prompts_per_step % self.world:
            raise ValueError(
                f"prompts_per_step ({cfg.prompts_per_step}) must be a multiple of the number of "
                f"processes ({self.world}): every rank trains on whole GRPO groups"
            )
        self.num_seqs = cfg.prompts_per_step * cfg.group_size
        self.local_groups = ddp.rank_groups(cfg.prompts_per_step, self.rank, self.world)
        self.num_local = len(self.local_groups) * cfg.group_size
        # the longest prompt, and the answer with its EOS, in tokens
        self.max_prompt_tokens, self.max_new_tokens = self.tok.token_budget(self.task)
        if cfg.max_new_tokens:  # the response budget, independent of the answer length
            self.max_new_tokens = cfg.max_new_tokens
        self.width = self.max_prompt_tokens + self.max_new_tokens
        self.heldout = []
        if cfg.eval_every > 0:
            self.heldout = heldout_problems(self.task, seed=cfg.seed, size=cfg.eval_size)
        if cfg.model:
            self.model = build_model(cfg, self.tok.vocab_size)
            num_params = sum(p.numel() for p in self.model.parameters())
            log(
                f"model: {cfg.model} ({type(self.model).__name__}, {num_params:,} parameters, "
                f"FP32 master weights); the preset's architecture fields are ignored. Tokenizer: "
                f"{type(self.tok.hf).__name__}, chat template "
                f"{'used' if self.tok.chat_template else 'absent'}, system prompt "
                f"{self.tok.system_prompt!r}, EOS id {self.tok.eos_id}; "
                f"sequence width {self.width} ({self.max_prompt_tokens} prompt + "
                f"{self.max_new_tokens} new tokens)"
            )
        else:
            self.model = build_model(cfg, self.tok.padded_vocab_size(16))
        self.step = 0
        self.learner_widths: set[int] = set()  # the learner widths met so far (one compile each)
        self.last_rollout: dict = {}  # the last step's problems, prompts, output, completions, rewards
        self.warm_start: dict = {}
        state = None
        if resume_from is not None:
            state = load_checkpoint(resume_from, kind="grpo", expect=self._identity())
            if state.get("world", 1) != self.world:
                raise CheckpointError(
                    f"{str(resume_from)!r} was written by {state.get('world', 1)} process(es); "
                    f"resume it with --nproc {state.get('world', 1)} (this run has {self.world})"
                )
            self.model.load_state_dict(state["model"])
        else:
            # rank 0 computes (or loads) the cached warm start first; the others then load it
            for turn in ((0,), tuple(range(1, self.world))):
                if self.rank in turn:
                    self.warm_start = load_or_warm_start(
                        self.model, cfg, self.task, self.tok, log=log
                    )
                ddp.barrier()
        self.ref_model = None
        if cfg.kl_coef > 0:  # the reference policy is the warm-started model
            ref = copy.deepcopy(self.model)
            if state is not None:
                ref.load_state_dict(state["ref_model"])
            self.ref_model = ref.requires_grad_(False)
        # The stochastic-rounding streams of the NVFP4 backward are a per-call-site counter
        # (fp4_compile.sr_stream): part of the run's state, saved and restored with it.
        set_sr_state(state.get("sr_state") if state is not None else None)
        # The engine owns its own copy of the weights (as a separate rollout would) and gets the
        # learner's after every optimizer step (full weights, gathered from the shards).
        # One rollout batch is ONE generate call (any engine takes any number of requests);
        # rollout_max_batch only sizes how many run at once.
        request = EngineRequest(
            model=self.model,
            recipe=self.recipe,
            device=self.device,
            max_batch=cfg.rollout_max_batch or self.num_local,
            max_seq_len=self.width,
            seed=cfg.seed,
            temperature=cfg.temperature,
            compile=cfg.compile,
            cuda_graphs=cfg.rollout_cuda_graphs,
            weights=cfg.rollout_weights,
            kv_tokens=cfg.rollout_kv_tokens,
        )
        self.engine = build_engine(cfg.rollout_engine, request, world=self.world)
        if self.world > 1:
            ddp.shard_model(self.model)  # FSDP2: parameters, gradients, optimizer state sharded
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=cfg.lr,
            betas=(cfg.beta1, cfg.beta2),
            weight_decay=cfg.weight_decay,
        )
        if state is not None:
            if self.world > 1:
                ddp.load_full_optimizer_state(self.model, self.optimizer, state["optimizer"])
            else:
                self.optimizer.load_state_dict(state["optimizer"])
            self.step = state["step"]
            set_rng_state(state["rng"])
        self.learner = _compile(self.model, self.recipe) if cfg.compile else self.model
        self.ref = None
        if self.ref_model is not None:
            # frozen: its NVFP4 weights quantized once, not in every forward (one process; the
            # same bits, tests/rollout/test_learner_weight_store.py)
            once = "on_change" if self.world == 1 else "every_call"
            self.ref = (
                _compile(self.ref_model, self.recipe, quantize_weights=once)
                if cfg.compile
                else self.ref_model
            )

    # ---- checkpoints ---------------------------------------------------------------------
    def _identity(self) -> dict:
        """What a resumed run must share with the checkpoint: recipe, settings, tokenizer, and for
        `model=DIR` the checkpoint directory (its path and a hash of its config and files)."""
        identity = {
            "fingerprint": self.recipe.fingerprint(),
            "numerics": self.cfg.numerics_dict(),
            "tokenizer": self.tok.to_dict(),
        }
        if self.cfg.model:
            identity["model_dir"] = model_dir_identity(self.cfg.model)
        return identity

    def state_dict(self) -> dict:
        """The run's state, full (not sharded): a collective when the learner is sharded (call
        it on every rank); every rank gets the same model weights."""
        if self.world > 1:
            model_sd = ddp.full_model_state(self.model)
            optim_sd = ddp.full_optimizer_state(self.model, self.optimizer)
        else:
            model_sd, optim_sd = self.model.state_dict(), self.optimizer.state_dict()
        state = {
            "step": self.step,
            "world": self.world,
            "model": model_sd,
            "optimizer": optim_sd,
            "rng": rng_state(),
            "sr_state": sr_state(),
            "recipe": self.recipe.to_dict(),
            "config": self.cfg.to_dict(),
            **self._identity(),
        }
        if self.ref_model is not None:
            state["ref_model"] = self.ref_model.state_dict()
        return state

    def save(self, folder: str | Path) -> Path:
        """Write a step checkpoint (rank 0 writes; every rank takes part in gathering it)."""
        state = self.state_dict()
        path = step_path(folder, self.step)
        if self.rank == 0:
            save_checkpoint(path, state, kind="grpo")
            prune_checkpoints(folder, keep=self.cfg.keep_checkpoints)
        ddp.barrier()
        return path

    # ---- held-out evaluation -----------------------------------------------------------
    def eval_due(self) -> bool:
        """Evaluate the current weights? At step 0, every `eval_every` steps, after the last."""
        every = self.cfg.eval_every
        return every > 0 and (self.step % every == 0 or self.step == self.cfg.steps)

    def evaluate(self) -> dict:
        """eval/accuracy and eval/reward of the current weights on the held-out set, greedy
        (rank 0 evaluates, the others return {}); RNG and SR state are left as they were."""
        if self.rank != 0 or not self.heldout:
            return {}
        t0 = time.perf_counter()
        metrics = evaluate(
            self.engine,
            self.task,
            self.tok,
            self.heldout,
            max_prompt_tokens=self.max_prompt_tokens,
            max_new_tokens=self.max_new_tokens,
        )
        metrics["perf/eval_s"] = time.perf_counter() - t0
        return metrics

    # ---- one step ------------------------------------------------------------------------
    def _pack(
        self, prompts: list[list[int]], out
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> ids [N, W'] (prompt, generated tokens up to the sequence's EOS, pad), mask [N, T']
        of generated targets, rollout log-probs [N, T'] aligned with the targets. W' is the
        learner width of the longest real sequence (over every rank: their batches must agree
        for the gathered diagnostics)."""
        longest = max(len(p) + len(gen) for p, gen in zip(prompts, out.tokens))
        width = learner_width(ddp.all_reduce_max(longest), self.width)
        if width not in self.learner_widths:
            if self.learner_widths and self.cfg.compile:
                self.log(
                    f"learner: first batch of width {width} (of at most "
                    f"{len(width_buckets(self.width))} widths, rl/train/batching.py): compiling it once"
                )
            self.learner_widths.add(width)
        ids, mask, rollout_logp = pack_batch(
            prompts, out.tokens, out.logprobs, pad_id=self.tok.pad_id, width=width
        )
        return ids.to(self.device), mask.to(self.device), rollout_logp.to(self.device)

    def _logprobs(self, model, ids_NW: torch.Tensor) -> torch.Tensor:
        """The learner's sequence log-probs: ONE forward over the whole padded batch, then the
        shared log-prob op at every target position -> [N, T] FP32 (as `sequence_logprobs`); a
        minite learner runs its head in row chunks (`rollout/learner_head.py`).
        A new learner width recompiles; hitting Dynamo's recompile limit is an error, never a
        silent eager (non-NVFP4) forward."""
        parts = chunked_head_parts(model)
        if parts is not None:  # the head only in row chunks: no [N, W, V] logits
            decoder, head_weight = parts
            hidden = learner_hidden(decoder, ids_NW)[:, :-1]
            logp = head_token_logprobs(
                hidden.reshape(-1, hidden.shape[-1]),
                head_weight,
                ids_NW[:, 1:].reshape(-1),
                self.cfg.temperature,
                DEFAULT_CHUNK_ROWS,
            )
            return logp.reshape(ids_NW.shape[0], -1)
        with no_silent_eager_fallback():
            logits = model(input_ids=ids_NW, use_cache=False).logits
        return token_logprobs(logits[:, :-1], ids_NW[:, 1:], self.cfg.temperature)

    def train_step(self) -> dict:
        cfg, tok, step = self.cfg, self.tok, self.step
        group = cfg.group_size
        t_start = time.perf_counter()
        all_problems = self.task.problems(
            cfg.prompts_per_step, seed=derive_seed(cfg.seed, "prompts", step)
        )
        # this rank's GRPO groups (all of them in one process); sampling seeds by global index
        problems = [all_problems[g] for g in self.local_groups]
        encoded = [tok.encode_prompt(p.prompt) for p in problems]
        for p, ids in zip(problems, encoded):
            if len(ids) > self.max_prompt_tokens:  # never truncated: the batch width is fixed
                raise ValueError(
                    f"prompt {p.prompt!r} encodes to {len(ids)} tokens, more than the "
                    f"{self.max_prompt_tokens} measured by token_budget; the width is fixed"
                )
        prompts = [ids for ids in encoded for _ in range(group)]
        seeds = [
            derive_seed(cfg.seed, "sample", step, g * group + j)
            for g in self.local_groups
            for j in range(group)
        ]
        preempted = getattr(self.engine, "kv_preemptions", 0)
        out = self.engine.generate(
            prompts,
            max_new_tokens=self.max_new_tokens,
            temperature=cfg.temperature,
            seed=seeds,
            eos_token_id=tok.eos_id,
        )
        t_rollout = time.perf_counter() - t_start
        preempted = getattr(self.engine, "kv_preemptions", 0) - preempted
        completions = [tok.decode(t) for t in out.tokens]  # each up to its own EOS
        # the verifier scores the answer the task extracts from each completion
        rewards = [self.task.reward(problems[i // group], c) for i, c in enumerate(completions)]
        self.last_rollout = {
            "problems": problems,
            "prompts": prompts,
            "output": out,
            "completions": completions,
            "rewards": rewards,
        }

        t_learn = time.perf_counter()
        ids, mask, rollout_logp = self._pack(prompts, out)
        rewards_N = torch.tensor(rewards, dtype=torch.float32, device=self.device)
        adv = group_advantages(rewards_N, group_size=group, scale=cfg.advantage_scale)
        dev: dict[str, torch.Tensor] = {}
        norm = {}
        if self.world > 1:  # global denominators: each rank's loss is its share of the global one
            norm = {
                "global_tokens": ddp.global_token_count(mask),
                "global_seqs": ddp.global_token_count((mask.sum(1) > 0).to(mask.dtype)),
            }
        for update in range(cfg.updates_per_batch):
            logp = self._logprobs(self.learner, ids)
            if update == 0:
                old_logp = logp.detach()
                # the mismatch over the GLOBAL batch, in the single-process order
                lt, lr, lm = (
                    ddp.gather_groups(t, self.local_groups, group)
                    for t in (old_logp.contiguous(), rollout_logp, mask)
                )
                dev.update(mismatch_tensors(lt, lr, lm))
                bounds = dict(
                    tis_cap=cfg.tis_cap,
                    mis_token_bounds=cfg.mis_token_bounds,
                    mis_seq_bounds=cfg.mis_seq_bounds,
                )
                is_weight, keep, corr = rollout_correction(old_logp, rollout_logp, mask, **bounds)
                if self.world > 1:  # its statistics over the global batch
                    corr = rollout_correction(lt, lr, lm, **bounds)[2]
                dev.update(corr)
                ref_logp = None
                if self.ref is not None:
                    with torch.no_grad():
                        ref_logp = self._logprobs(self.ref, ids)
            loss, stats = policy_loss(
                logp,
                old_logp,
                adv,
                keep,
                clip_low=cfg.clip_low,
                clip_high=cfg.clip_high,
                aggregation=cfg.aggregation,
                is_weight=is_weight,
                ref_logp=ref_logp,
                kl_coef=cfg.kl_coef,
                **norm,
            )
            self.optimizer.zero_grad(set_to_none=True)
            # FSDP2 averages gradients over ranks: scale the rank's share back to the sum
            (loss * self.world if self.world > 1 else loss).backward()
            max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
            self.optimizer.step()
        stats = {k: ddp.all_reduce_sum(v) for k, v in stats.items()} if self.world > 1 else stats
        dev.update(stats)
        dev["grad/norm"] = ddp.full_tensor(grad_norm)
        self.engine.update_weights(self.model)
        names = sorted(dev)
        values = torch.stack(
            [dev[k].detach().reshape(()).double() for k in names]
        ).tolist()  # the sync
        t_end = time.perf_counter()

        # host-side results of every rank, back in the single-process order
        local = [
            (len(t), len(p), r, c, f, self.task.extract_answer(c))
            for t, p, r, c, f in zip(out.tokens, prompts, rewards, completions, out.finish_reasons)
        ]
        gathered = ddp.gather_group_objects(local, self.local_groups, group)
        gen_tokens = sum(g[0] for g in gathered)
        real_tokens = sum(g[1] for g in gathered) + gen_tokens
        rewards_all = [g[2] for g in gathered]
        # exact: the extracted answer is the reference string itself
        exact = [float(g[5] == all_problems[i // group].answer) for i, g in enumerate(gathered)]
        record = {"step": step}
        record["reward/mean"] = sum(rewards_all) / len(rewards_all)
        record["reward/exact_frac"] = sum(exact) / len(exact)
        for name in sorted({p.task for p in all_problems}):
            idx = [i for i in range(self.num_seqs) if all_problems[i // group].task == name]
            record[f"reward/{name}"] = sum(rewards_all[i] for i in idx) / len(idx)
        lengths = [g[0] for g in gathered]
        record["rollout/mean_new_tokens"] = gen_tokens / self.num_seqs
        record["rollout/min_new_tokens"] = min(lengths)
        record["rollout/max_new_tokens"] = max(lengths)
        record["perf/learner_width"] = ids.shape[1]
        record["rollout/eos_frac"] = [g[4] for g in gathered].count("eos") / self.num_seqs
        if cfg.rollout_kv_tokens:  # this process's requests restarted for lack of KV pages
            record["rollout/kv_preemptions"] = preempted
        record.update(zip(names, values))
        record["perf/rollout_s"] = t_rollout
        record["perf/learner_s"] = t_end - t_learn
        record["perf/step_s"] = t_end - t_start
        record["perf/rollout_tokens_per_s"] = gen_tokens / max(t_rollout, 1e-9)
        record["perf/learner_tokens_per_s"] = (
            real_tokens * cfg.updates_per_batch / max(t_end - t_learn, 1e-9)
        )
        prompt_text = tok.decode(tok.encode_prompt(all_problems[0].prompt), stop_at_eos=False)
        record["sample"] = f"{prompt_text}{gathered[0][3]}"
        if self.world > 1:
            record["world"] = self.world
        self.step += 1
        return record


def compile_notice(model) -> str:
    """What the first step compiles and about how long, scaled by the model's depth from one
    measurement (the 2-layer tiny preset: about 40 s on 2 CPU cores; each decoder layer adds
    graph to trace and code to generate)."""
    cfg = getattr(model.config, "text_config", None) or model.config
    layers = int(getattr(cfg, "num_hidden_layers", 2))
    seconds = 20 + 10 * layers
    return (
        "compiling: the first GRPO step compiles the rollout engine (prefill, decode) and the "
        f"learner (forward, backward) with backend='minite'; for {layers} decoder layers about "
        f"{seconds} s on 2 CPU cores (measured: 40 s for the 2-layer tiny preset), once: later "
        "runs reuse Inductor's cache"
    )


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    fresh: bool = False,
    progress: bool = True,
    log=print,
    stop=None,
) -> dict:
    """A whole run: warm start (cached), `cfg.steps` GRPO steps with checkpoints every
    `cfg.checkpoint_every`, metrics.jsonl, plots and a summary under `cfg.out_dir`.
    `stop`: called after each step (one process); True ends the run there, checkpoint saved
    (Ctrl-C in `minite train`). Returns {"records", "summary", "plots", "out_dir", "trainer"}."""
    out_dir = Path(cfg.out_dir)
    ckpt_dir = out_dir / "checkpoints"
    rank, world = ddp.rank_world()
    latest = latest_checkpoint(ckpt_dir)
    ddp.barrier()  # every rank has looked before rank 0 deletes anything
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
        if rank == 0:
            for p in ckpt_dir.glob("step_*.ckpt"):
                p.unlink()
    ddp.barrier()
    if rank != 0:  # rank 0 logs, plots and writes for the run
        log, progress = (lambda *a, **k: None), False
    t0 = time.perf_counter()
    trainer = GRPOTrainer(cfg, resume_from=latest if resume else None, log=log)
    if resume:
        log(f"resumed from {latest} at step {trainer.step}")
    t_setup = time.perf_counter() - t0
    logger = None
    if rank == 0:
        logger = RunLogger(out_dir, resume_step=trainer.step if resume else None, log=log)
    bar = ProgressBar(cfg.steps, start=trainer.step, every=cfg.log_every) if progress else None
    try:
        if cfg.compile and trainer.step < cfg.steps:
            log(compile_notice(trainer.model))
        first = cfg.compile
        while trainer.step < cfg.steps:
            t_step = time.perf_counter()
            # a line every 10 s while the first step compiles (instead of silence)
            with Heartbeat(log, every_s=10.0) if first else nullcontext():
                # the held-out score of the weights this step starts from (step 0: before GRPO)
                evaluated = trainer.evaluate() if trainer.eval_due() else {}
                record = trainer.train_step()
            record.update(evaluated)
            if first:
                took = time.perf_counter() - t_step
                log(f"compiled: the first step, compilation included, took {took:.1f} s")
                first = False
            if logger is not None:
                logger.log(record)
            if bar is not None:
                bar.update(record["step"], record)
            stopping = stop is not None and stop()
            if stopping or trainer.step % cfg.checkpoint_every == 0 or trainer.step == cfg.steps:
                trainer.save(ckpt_dir)
            if stopping:
                break
        if trainer.eval_due():  # the final weights: a record of their own, step = cfg.steps
            evaluated = trainer.evaluate()
            if logger is not None and evaluated:
                logger.log({"step": trainer.step, **evaluated})
    finally:
        if logger is not None:
            logger.close()
    if logger is None:
        return {"records": [], "summary": "", "plots": [], "out_dir": out_dir, "trainer": trainer}
    records = logger.records
    plots = write_plots(records, out_dir) if records else []
    extra = {
        "recipe": f"{cfg.name} / {cfg.variant} (fingerprint {trainer.recipe.fingerprint()})",
        "processes": f"{world} (FSDP2)" if world > 1 else "1",
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
