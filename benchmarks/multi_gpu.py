"""Multi-GPU GRPO (issue 56): the FSDP2 learner over N-1 ranks, the rollout engine on the last
rank fed the learner's NVFP4 bytes, and the N-rank learner against one process.

    python -m benchmarks.multi_gpu --nproc N [--model tiny-qwen3-moe|qwen3-30b-a3b] [--layers 2]
        [--prompts 4] [--group 4] [--prompt 8] [--budget 8] [--steps 2] [--engine-rank last|none]
        [--compare-single]

(`--nproc` re-runs it under `torch.distributed.run --standalone`; or launch it with torchrun.)
NCCL with one GPU per rank and NVLink multicast off where CUDA is present, else gloo on the CPU.
A strict-recipe step: the engine generates `--prompts` x `--group` requests (or, with
`--engine-rank none`, every rank makes the same synthetic batch), random rewards, group
advantages, each learner rank takes its whole groups (`rank_groups`) and runs the GRPO clipped
surrogate (`policy_loss`) divided by the GLOBAL token count, FSDP2 averaging the gradients,
then AdamW. Before every rollout the learner's weights reach the engine (`multi_gpu_sync.py`):
a BF16 refit (every parameter, the engine quantizes) as the baseline, then the NVFP4 sync (the
learner's packed bytes into the engine's store, in place), timed on the engine from a common
barrier; the NVFP4 bytes must equal the engine's own quantize of the BF16 refit, and the
learner's `sequence_logprobs` must equal the engine's generate log-probs bit for bit on a few
check prompts.

`--compare-single`: rank 0 also runs the same steps alone (no FSDP, the whole batch, the same
stochastic-rounding state) and, as tests/rl/train/test_fsdp.py does, the same batch split by
learner rank in ONE process, each part from the same rounding state as its rank. Gradients are
not bitwise across process counts (docs/scale_out.md): the NVFP4 wgrad quantizes each part's dY
with its own per-tensor amax and stochastic-rounding draws, so the gradient is a sample; "split
in one vs 1" as large as "N ranks vs 1" attributes the gap to the split, not to FSDP. ("N vs
split in one" is no smaller: under FSDP2 each layer compiles alone, its GEMM sites named from
the layer, so its rounding streams are not the whole-model graph's.)
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

from benchmarks.common import environment, write_results
from benchmarks.multi_gpu_report import parse_args, report
from benchmarks.multi_gpu_sync import (
    bytes_differing,
    compare,
    engine_layout,
    make_roles,
    recv_full,
    recv_packed,
    send_full,
    send_packed,
    store_snapshot,
    sync_device,
)
from fp4_compile import NVFP4Recipe
from fp4_compile.models import build_causal_lm
from fp4_compile.rl.train.distributed import (
    NCCL_ENV,
    full_parameters,
    init_from_env,
    rank_groups,
    shard_model,
)
from fp4_compile.rl.train.grpo import group_advantages, policy_loss
from fp4_compile.rollout import RolloutEngine, sequence_logprobs
from fp4_compile.rollout.weight_sync import full_tensor
from fp4_compile.sr_stream import set_sr_state, sr_state

RECIPE = NVFP4Recipe.strict()
CHECK_PROMPTS, CHECK_NEW = 4, 4  # the learner == rollout check after every sync


def share(obj, roles):
    """`obj` from the engine rank to every rank (itself where there is no engine)."""
    if roles.engine is None:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=roles.engine)
    return box[0]


def learner_barrier(roles) -> None:
    if roles.learn_group is not None:
        dist.barrier(group=roles.learn_group)


def batch_prompts(args, vocab: int, step: int) -> tuple[list[list[int]], list[int]]:
    """`--prompts` random prompts, each repeated `--group` times, and one seed per request."""
    g = torch.Generator().manual_seed(1_000 + step)
    prompts = [
        torch.randint(1, vocab, (args.prompt,), generator=g).tolist() for _ in range(args.prompts)
    ]
    requests = [p for p in prompts for _ in range(args.group)]
    return requests, [step * 100_003 + i for i in range(len(requests))]


def check_prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    return [torch.randint(1, vocab, (3 + i,), generator=g).tolist() for i in range(CHECK_PROMPTS)]


# ---- the engine rank ---------------------------------------------------------------------------


def run_engine(args, roles, model) -> None:
    cuda = roles.device.type == "cuda"
    engine = RolloutEngine(
        model,
        recipe=RECIPE,
        weights="packed",
        max_batch=args.max_batch,
        max_seq_len=args.prompt + args.budget,
        cuda_graphs=cuda,
    )
    vocab = model.config.vocab_size
    checks = check_prompts(vocab)
    engine.generate(checks, max_new_tokens=CHECK_NEW, seed=0)  # compiles; fills the store
    layout = share(engine_layout(engine), roles)
    buffers = {  # the BF16 refit's landing place (the packed engine released its own)
        n: torch.empty(p.shape, dtype=p.dtype, device=roles.device)
        for n, p in model.named_parameters()
    }
    records, previous = [], store_snapshot(engine)
    for version in range(args.steps + 1):
        dist.barrier(group=roles.sync_group)
        t0 = time.perf_counter()
        engine_quantize_s = recv_full(engine, buffers, layout, roles)
        bf16_s = time.perf_counter() - t0
        engine_quantized = store_snapshot(engine)
        dist.barrier(group=roles.sync_group)
        t0 = time.perf_counter()
        got = recv_packed(engine, layout, roles)
        sync_device(roles.device)
        nvfp4_s = time.perf_counter() - t0
        now = store_snapshot(engine)
        rec = {
            "bf16_refit_s": bf16_s,
            "bf16_engine_quantize_s": engine_quantize_s,
            "nvfp4_sync_s": nvfp4_s,
            "nvfp4_bytes_received": got,
            "nvfp4_vs_engine_quantize_bytes_differing": bytes_differing(engine_quantized, now),
            "store_bytes_changed": bytes_differing(previous, now),
        }
        previous = now
        out = engine.generate(checks, max_new_tokens=CHECK_NEW, seed=list(range(CHECK_PROMPTS)))
        share((out.tokens, [x.cpu() for x in out.logprobs]), roles)
        if version < args.steps:
            requests, seeds = batch_prompts(args, vocab, version)
            sync_device(roles.device)
            t0 = time.perf_counter()
            out = engine.generate(requests, max_new_tokens=args.budget, seed=seeds)
            sync_device(roles.device)
            rec["rollout_s"] = time.perf_counter() - t0
            share(out.tokens, roles)
        records.append(rec)
    share(records, roles)


# ---- the learner ranks -----------------------------------------------------------------------


def group_rows(args, rank: int, num_learners: int) -> list[int]:
    """The batch rows (requests) of learner rank `rank`'s GRPO groups."""
    groups = rank_groups(args.prompts, rank, num_learners)
    return [g * args.group + j for g in groups for j in range(args.group)]


def padded(xs: list[torch.Tensor]) -> torch.Tensor:
    width = max(len(x) for x in xs)
    return torch.stack([torch.nn.functional.pad(x, (0, width - len(x))) for x in xs])


def grpo_loss(learner, batch, rows: list[int], device) -> torch.Tensor:
    """This part's additive share of the batch's token-mean clipped surrogate."""
    requests, tokens, adv, n_global = batch
    seqs = [requests[i] + tokens[i] for i in rows]
    logp = sequence_logprobs(learner, seqs, [len(requests[i]) for i in rows], device=device)
    new, mask = padded(logp), padded([torch.ones_like(x) for x in logp])
    loss, _ = policy_loss(
        new,
        new.detach(),
        adv[rows].to(device),
        mask,
        clip_low=0.2,
        clip_high=0.28,
        global_tokens=n_global,
    )
    return loss


def full_grads(model) -> dict[str, torch.Tensor]:
    inner = getattr(model, "_orig_mod", model)
    return {n: full_tensor(p.grad).detach().clone() for n, p in inner.named_parameters()}


def check_aligned(learner, checks, got, device) -> int:
    """Check prompts whose learner log-probs equal the engine's bit for bit (every learner
    rank runs the forward: FSDP all-gathers)."""
    tokens, engine_logps = got
    seqs = [p + t for p, t in zip(checks, tokens)]
    with torch.no_grad():
        mine = sequence_logprobs(learner, seqs, [len(p) for p in checks], device=device)
    same = [
        torch.equal(a.cpu().view(torch.int32), b.view(torch.int32))
        for a, b in zip(mine, engine_logps)
    ]
    return sum(same)


def single_step(single, args, roles, batch, state0, grads_n) -> dict:
    """Rank 0 alone: the same batch split by learner rank in one process, each part from the
    rounding state its rank had, then the whole batch, one AdamW step (`single` = (module,
    compiled, optimizer))."""
    module, learner, opt = single
    num = args.prompts * args.group
    for r in range(roles.num_learners):
        set_sr_state(state0)
        rows = group_rows(args, r, roles.num_learners)
        grpo_loss(learner, batch, rows, roles.device).backward()
    split = full_grads(module)
    opt.zero_grad(set_to_none=True)
    set_sr_state(state0)
    sync_device(roles.device)
    t0 = time.perf_counter()
    grpo_loss(learner, batch, list(range(num)), roles.device).backward()
    opt.step()
    sync_device(roles.device)
    step_s = time.perf_counter() - t0
    one = full_grads(module)
    opt.zero_grad(set_to_none=True)
    return {
        "single_step_s": step_s,
        "grad_n_vs_1": compare(one, grads_n),
        "grad_split_in_one_vs_1": compare(one, split),
        "grad_n_vs_split_in_one": compare(split, grads_n),
    }


def run_learner(args, roles, model) -> list[dict] | None:
    vocab, device = model.config.vocab_size, roles.device
    lrank, num_learners = roles.rank, roles.num_learners
    layout = share(None, roles)
    single = None
    if args.compare_single and lrank == 0:
        module = copy.deepcopy(model).train()
        compiled = torch.compile(module, backend="minite", options={"recipe": RECIPE})
        single = (module, compiled, torch.optim.AdamW(module.parameters(), lr=args.lr))
    if num_learners > 1:
        from torch.distributed.device_mesh import DeviceMesh  # lazy: only a sharded learner

        shard_model(model, mesh=DeviceMesh.from_group(roles.learn_group, device.type))
    learner = torch.compile(model, backend="minite", options={"recipe": RECIPE})
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    checks, records = check_prompts(vocab), []
    before_n = before_1 = {}  # the weights before the last step: N ranks', the 1 process's
    for version in range(args.steps + 1):
        rec = {}
        t0 = time.perf_counter()
        full = full_parameters(model)
        rec["gather_s"] = time.perf_counter() - t0
        if roles.engine is not None:
            if lrank == 0:
                dist.barrier(group=roles.sync_group)
                rec["bf16_bytes_sent"] = send_full(full, roles)
                dist.barrier(group=roles.sync_group)
                rec.update(send_packed(layout, full, roles))
            rec["learner_eq_rollout"] = check_aligned(learner, checks, share(None, roles), device)
        if single is not None and version > 0:  # the weights after the step, N ranks vs 1
            one = dict(single[0].named_parameters())
            records[-1]["weights_n_vs_1"] = compare({n: t.detach() for n, t in one.items()}, full)
            records[-1]["update_n_vs_1"] = compare(
                {n: one[n].detach() - before_1[n] for n in full},
                {n: full[n] - before_n[n] for n in full},
            )
        if version == args.steps:
            records.append(rec)
            break
        requests, _ = batch_prompts(args, vocab, version)
        if roles.engine is not None:
            tokens = share(None, roles)
        else:  # synthetic responses, the same on every rank
            g = torch.Generator().manual_seed(2_000 + version)
            tokens = [
                torch.randint(1, vocab, (args.budget,), generator=g).tolist() for _ in requests
            ]
        rewards = torch.rand(len(requests), generator=torch.Generator().manual_seed(version))
        adv = group_advantages(rewards, group_size=args.group)
        n_global = torch.tensor(float(sum(len(t) for t in tokens)), device=device)
        batch = (requests, tokens, adv, n_global)
        rows = group_rows(args, lrank, num_learners)
        state0 = sr_state()
        learner_barrier(roles)
        sync_device(device)
        t0 = time.perf_counter()
        (grpo_loss(learner, batch, rows, device) * num_learners).backward()  # FSDP2 averages
        opt.step()
        sync_device(device)
        learner_barrier(roles)
        rec["learner_step_s"] = time.perf_counter() - t0
        rec["tokens"] = int(n_global.item())
        if single is not None or args.compare_single:
            grads_n = full_grads(model)  # a collective: every learner rank
            if single is not None:
                state_after, before_n = sr_state(), full
                before_1 = {n: p.detach().clone() for n, p in single[0].named_parameters()}
                rec.update(single_step(single, args, roles, batch, state0, grads_n))
                set_sr_state(state_after)  # rank 0 keeps its ranks' rounding streams
        opt.zero_grad(set_to_none=True)
        records.append(rec)
    engine_records = share(None, roles)
    if lrank != 0:
        return None
    for rec, eng in zip(records, engine_records or [{}] * len(records)):
        rec.update(eng)
    return records


def main() -> int:
    args = parse_args()
    if args.nproc and "WORLD_SIZE" not in os.environ:
        argv, rest = iter(sys.argv[1:]), []
        for a in argv:  # torchrun would read "--nproc" as its own (ambiguous) option
            if a == "--nproc":
                next(argv)
            elif not a.startswith("--nproc="):
                rest.append(a)
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={args.nproc}",
            "-m",
            "benchmarks.multi_gpu",
            *rest,
        ]
        env = {**NCCL_ENV, **os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        return subprocess.run(cmd, env=env, check=False).returncode
    cuda = torch.cuda.is_available()
    rank, world = init_from_env("cuda" if cuda else "cpu")
    device = torch.device(f"cuda:{torch.cuda.current_device()}" if cuda else "cpu")
    engine = args.engine_rank == "last"
    learners = world - 1 if engine else world
    if (
        args.steps < 1
        or args.group < 2
        or args.prompts % max(learners, 1)
        or (engine and world < 2)
    ):
        raise ValueError(
            f"need --steps >= 1, --group >= 2, --prompts a multiple of the {learners} learner "
            f"rank(s), and 2+ ranks with an engine rank (world {world})"
        )
    roles = make_roles(rank, world, device, with_engine=engine)
    model = build_causal_lm(args.model, layers=args.layers, device=device).train()
    if roles.is_engine:
        run_engine(args, roles, model.eval())
        records = None
    else:
        records = run_learner(args, roles, model)
    if records is not None:
        env = {**environment(), "world": world, "device": str(device)}
        text = report(records, args, env, world, engine, CHECK_PROMPTS)
        name = args.name or f"multi_gpu_{args.model.replace('-', '_')}_{device.type}_n{world}"
        payload = {"env": env, "args": vars(args), "records": records}
        print(text, flush=True)
        print("written:", *write_results(name, payload, text))
    if world > 1:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
