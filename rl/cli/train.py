"""`minite train PRESET [--variant strict|te|bf16] [--nproc N] [key=value ...] [--resume | --fresh]`.

Wired into the `minite` console script (fp4_compile/cli.py) by two calls:
`add_train_parser(subparsers)` and, for args.command == "train", `run_train(args)`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import torch.distributed as dist

from ..train.checkpoint import latest_checkpoint
from ..train.config import VARIANTS
from ..train.distributed import NCCL_ENV, init_from_env, rank_world
from ..train.engines import engines_help
from ..train.interrupt import StopOnInterrupt, resume_command
from ..train.preflight import check_gemm_shapes
from ..train.presets import PRESETS, get_preset
from ..train.run_dir import claim_run_dir, discard_empty_run, out_dir_given, resolve_run_dir
from ..train.run_log import read_jsonl, summary, write_plots
from ..train.trainer import train


def _add_options(p: argparse.ArgumentParser, *, defaults: bool = True) -> None:
    d = (lambda v: v) if defaults else (lambda v: argparse.SUPPRESS)
    p.add_argument(
        "--variant",
        choices=VARIANTS,
        default=d("strict"),
        help="strict: NVFP4 aligned; te: NVFP4 per-tensor scales + token TIS; bf16: no quantization",
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--resume",
        action="store_true",
        default=d(False),
        help="continue from the latest checkpoint in out_dir (without out_dir=: the newest "
        "numbered run folder of the preset)",
    )
    group.add_argument(
        "--fresh",
        action="store_true",
        default=d(False),
        help="delete what out_dir's earlier run wrote (checkpoints, export/, logs, plots; each "
        "named) and start over (without out_dir=: the newest numbered run folder of the preset)",
    )
    p.add_argument("--no-progress", action="store_true", default=d(False), help="no progress bar")
    p.add_argument(
        "--nproc",
        type=int,
        default=d(1),
        help="learner processes (FSDP2 data parallel via torchrun; gloo on CPU, NCCL on GPUs)",
    )
    p.add_argument(
        "--print-config",
        action="store_true",
        default=d(False),
        help="print the resolved settings and exit",
    )


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "train",
        help="GRPO on a verifiable task: warm start, rollouts, NVFP4 learner, logs and plots",
        description=(
            "Run a named training preset. Settings are replaced with key=value (e.g. steps=80 "
            "lr=1e-3 tis_cap=2 mis_seq_bounds=0.5,2 compile=false), in any order with the "
            "options; model=DIR trains a local transformers checkpoint with its tokenizer and "
            "chat template instead of the preset's random-init model. Writes metrics.jsonl, PNG "
            "plots, summary.txt and checkpoints under out_dir. Without out_dir=, every run gets "
            "its own folder: runs/PRESET-VARIANT (runs/MODELDIR-PRESET-VARIANT for model=DIR), "
            "and when that holds an earlier run, the next numbered one (runs/tiny-strict-2, "
            "-3, ...), so running the same command again just works and never touches an "
            "earlier run; --resume continues the newest. An out_dir= that holds a run is refused "
            "unless --resume or --fresh says what to do. One run per folder: a folder another "
            "running minite train holds is refused (without out_dir=, the next numbered one is "
            "taken)."
        ),
        epilog=engines_help(),
    )
    p.add_argument(
        "preset", choices=sorted(PRESETS), help="named training preset (rl/train/presets.py)"
    )
    _add_options(p)
    # argparse cannot mix positionals and options after a subcommand; collect the rest and
    # parse it again, intermixed, in run_train
    p.add_argument(
        "rest", nargs=argparse.REMAINDER, metavar="key=value", help="replace preset settings"
    )
    return p


def _parse_rest(args: argparse.Namespace) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=f"minite train {args.preset}", add_help=False)
    _add_options(p, defaults=False)
    p.add_argument("overrides", nargs="*")
    ns = argparse.Namespace(**{k: v for k, v in vars(args).items() if k != "rest"})
    p.parse_intermixed_args(list(getattr(args, "rest", []) or []), namespace=ns)
    if ns.resume and ns.fresh:
        raise ValueError("--resume and --fresh exclude each other")
    return ns


def run_train(args: argparse.Namespace) -> int:
    args = _parse_rest(args)
    if args.nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {args.nproc}")
    cfg = get_preset(args.preset, args.variant).with_overrides(list(args.overrides))
    if args.print_config:
        print(json.dumps(printable_config(cfg, args), indent=2))
        return 0
    launcher = args.nproc > 1 and "WORLD_SIZE" not in os.environ
    if "WORLD_SIZE" not in os.environ:  # torchrun's ranks get the folder from the launcher
        check_gemm_shapes(cfg)  # a model the recipe cannot lower, refused before any work
        if launcher and cfg.prompts_per_step % args.nproc:
            raise ValueError(
                f"prompts_per_step={cfg.prompts_per_step} must be a multiple of --nproc "
                f"{args.nproc}: every process trains on whole GRPO groups"
            )
        # pre-flight: which folder, and whether the run can start there, before any work; the
        # folder stays locked for this run (the launcher's, for --nproc N)
        cfg, note, lock = claim_run_dir(
            cfg, explicit=out_dir_given(args.overrides), resume=args.resume, fresh=args.fresh
        )
        if note:
            print(note, flush=True)
    else:
        lock = None
    failed = True
    try:
        if launcher:
            code = _launch(args, out_dir=cfg.out_dir)
        else:
            code = _train(args, cfg)
        failed = code not in (0, 130)
        return code
    finally:
        if lock is not None:
            lock.release()
            if failed:  # a run that failed before its first step leaves no folder behind
                discard_empty_run(Path(cfg.out_dir))


# TrainConfig fields a model=DIR run does not read (the checkpoint's config.json decides)
ARCHITECTURE_FIELDS = (
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
)
# config.json keys shown instead, for model=DIR
MODEL_CONFIG_KEYS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "vocab_size",
)


def printable_config(cfg, args: argparse.Namespace) -> dict:
    """The settings the run would use, as `--print-config` shows them: out_dir the folder it
    would write to (run_dir.py's rule, nothing created), and for model=DIR the checkpoint's
    architecture (config.json) instead of the preset's fields, which that run ignores."""
    d = cfg.to_dict()
    try:
        resolved, _ = resolve_run_dir(
            cfg, explicit=out_dir_given(args.overrides), resume=args.resume, fresh=args.fresh
        )
        d["out_dir"] = resolved.out_dir
    except ValueError as e:  # the run would be refused: say so instead of a folder
        d["out_dir"] = f"{cfg.out_dir} (the run would be refused: {e})"
    if cfg.model:
        for name in ARCHITECTURE_FIELDS:
            d.pop(name)
        config = json.loads((Path(cfg.model) / "config.json").read_text())
        d["model_config"] = {k: config[k] for k in MODEL_CONFIG_KEYS if k in config}
    return d


def _train(args: argparse.Namespace, cfg) -> int:
    init_from_env(cfg.device)
    one_process = rank_world()[1] == 1  # ranks of torchrun keep the default Ctrl-C
    stop = StopOnInterrupt()
    again = resume_command(args.preset, args.variant, list(args.overrides), cfg.out_dir)
    try:
        with stop.installed() if one_process else contextlib.nullcontext():
            result = train(
                cfg,
                resume=args.resume,
                fresh=args.fresh,
                progress=not args.no_progress,
                stop=stop if one_process else None,
            )
    except KeyboardInterrupt:
        if one_process:
            _report_interrupted(cfg, again)
        raise
    finally:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    if rank_world()[0] == 0 and result["summary"]:
        print(result["summary"])
        print("plots: " + ", ".join(str(p) for p in result["plots"]))
    if stop.requested:
        step = result["trainer"].step
        print(
            f"stopped by Ctrl-C after step {step} of {cfg.steps}; checkpoint saved. Continue "
            f"with:\n  {again}"
        )
        return 130
    return 0


def _report_interrupted(cfg, again: str) -> None:
    """After a Ctrl-C that stopped the run at once: the summary and plots of the steps logged,
    the checkpoint a `--resume` continues from, and the command."""
    out_dir = Path(cfg.out_dir)
    records = read_jsonl(out_dir / "metrics.jsonl")
    if records:
        text = summary(
            records, title=f"minite train {cfg.name} --variant {cfg.variant} (interrupted)"
        )
        (out_dir / "summary.txt").write_text(text + "\n")
        print(text)
        print("plots: " + ", ".join(str(p) for p in write_plots(records, out_dir)))
    latest = latest_checkpoint(out_dir / "checkpoints")
    if latest is None:
        print("interrupted before the first checkpoint: nothing to resume; run it again")
    else:
        done = max((r["step"] + 1 for r in records if "reward/mean" in r), default=0)
        print(
            f"interrupted after {done} step(s); the last checkpoint is {latest.name} (the steps "
            f"after it are redone). Continue with:\n  {again}"
        )


def _launch(args: argparse.Namespace, *, out_dir: str) -> int:
    """Re-run this command under torchrun with `--nproc` processes on this machine, with the
    run folder the launcher resolved (every rank writes to the same one)."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={args.nproc}",
        "-m",
        "fp4_compile.cli",
        "train",
        args.preset,
        "--variant",
        args.variant,
    ]
    cmd += ["--resume"] if args.resume else []
    cmd += ["--fresh"] if args.fresh else []
    cmd += ["--no-progress"] if args.no_progress else []
    cmd += list(args.overrides) + [f"out_dir={out_dir}"]
    env = {**NCCL_ENV, **os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    return subprocess.run(cmd, env=env, check=False).returncode
