"""`minite export RUN_DIR_OR_CKPT [--format compressed-tensors|modelopt] [--out DIR] [--overwrite]`.

Rebuilds the policy of a GRPO run's checkpoint (`runs/<name>/checkpoints/step_*.ckpt`, the
latest one when given the run folder) from the run's own config and recipe, and writes it with
`fp4_compile.export_checkpoint`. Defaults: compressed-tensors (what vLLM loads), written to
`RUN_DIR/export/<format>-step_<N>`. The destination must be new or empty; `--overwrite` replaces
an earlier minite export there (never another folder). Wired into fp4_compile/cli.py by `add_export_parser` and
`run_export`, like `minite train`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ...checkpoints import export_checkpoint
from ...recipe import NVFP4Recipe
from ..train.checkpoint import latest_checkpoint, load_checkpoint
from ..train.config import TrainConfig, build_model

FORMATS = ("compressed-tensors", "modelopt")


def add_export_parser(subparsers):
    p = subparsers.add_parser(
        "export",
        help="write a GRPO run's policy as an NVFP4 checkpoint vLLM / SGLang / TRT-LLM load",
        description=(
            "Export the policy of a GRPO checkpoint (a step_*.ckpt file, or a run folder: its "
            "latest checkpoint) with the learner's own NVFP4 bytes. See docs/checkpoints.md."
        ),
    )
    p.add_argument("source", help="run folder (runs/NAME) or a step_*.ckpt file")
    p.add_argument(
        "--format",
        choices=list(FORMATS),
        default="compressed-tensors",
        help="checkpoint format (default compressed-tensors: what vLLM loads)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="new or empty folder for the checkpoint (default RUN_DIR/export/FORMAT-step_N)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an earlier minite export in --out (a folder holding anything else is "
        "still refused)",
    )
    return p


def resolve_checkpoint(source: str | Path) -> Path:
    """A step_*.ckpt file as is; for a folder, the latest checkpoint in it or its checkpoints/."""
    source = Path(source)
    if source.is_file():
        return source
    for folder in (source / "checkpoints", source):
        found = latest_checkpoint(folder)
        if found is not None:
            return found
    raise ValueError(
        f"source {str(source)!r} is neither a checkpoint file nor a run folder "
        "holding checkpoints/step_*.ckpt"
    )


def policy_from_checkpoint(path: str | Path):
    """(model with the checkpoint's policy weights on CPU, recipe, tokenizer dict or None)."""
    state = load_checkpoint(path, kind="grpo")
    cfg = TrainConfig.from_dict(state["config"])
    cfg = dataclasses.replace(cfg, device="cpu", rollout_cuda_graphs=False)
    vocab = state["model"]["model.embed_tokens.weight"].shape[0]
    model = build_model(cfg, vocab)
    model.load_state_dict(state["model"])
    return model, NVFP4Recipe.from_dict(state["recipe"]), state.get("tokenizer")


def default_out(ckpt: Path, fmt: str) -> Path:
    """RUN_DIR/export/<format>-step_<N> for RUN_DIR/checkpoints/step_<N>.ckpt (a checkpoint
    outside a checkpoints/ folder: next to it)."""
    run = ckpt.parent.parent if ckpt.parent.name == "checkpoints" else ckpt.parent
    return run / "export" / f"{fmt}-{ckpt.stem}"


def prepare_out(out: Path, *, overwrite: bool) -> None:
    """A new or empty folder; with `overwrite`, an earlier minite export there is removed first
    (its files only: a folder holding anything but an export's files is refused)."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} exists and is not a folder")
    if not out.is_dir() or not any(out.iterdir()):
        return
    try:
        qc = json.loads((out / "config.json").read_text()).get("quantization_config") or {}
        ours = "minite" in qc
    except (OSError, ValueError, AttributeError):
        ours = False
    entries = list(out.iterdir())
    if not ours or any(not p.is_file() for p in entries):  # refused with or without --overwrite
        names = ", ".join(sorted(p.name + ("/" if p.is_dir() else "") for p in entries)[:5])
        raise ValueError(
            f"--out {str(out)!r} holds files that are not a minite export ({names}); export "
            "writes only into a new or empty folder or over an earlier export (--overwrite): "
            "choose --out NEW_FOLDER"
        )
    if not overwrite:
        raise ValueError(
            f"--out {str(out)!r} holds an earlier minite export; pass --overwrite to replace it, "
            "or --out NEW_FOLDER"
        )
    for p in entries:
        p.unlink()
    print(f"--overwrite: removed the earlier export in {out} ({len(entries)} files)")


def run_export(args) -> int:
    ckpt = resolve_checkpoint(args.source)
    out = Path(args.out) if args.out else default_out(ckpt, args.format)
    prepare_out(out, overwrite=args.overwrite)  # before the policy is rebuilt
    model, recipe, tokenizer = policy_from_checkpoint(ckpt)
    if tokenizer is not None and tokenizer.get("kind") == "hf":  # a model=DIR run: its tokenizer
        # lazy: transformers is optional (the hf extra) and costs seconds at import
        from transformers import AutoTokenizer

        hf_tokenizer = AutoTokenizer.from_pretrained(tokenizer["path"])
        out = export_checkpoint(
            model, out, format=args.format, recipe=recipe, tokenizer=hf_tokenizer
        )
        tokenizer = None
    else:
        out = export_checkpoint(model, out, format=args.format, recipe=recipe)
    if tokenizer is not None:  # the run's own character tokenizer: not a transformers one
        (Path(out) / "minite_tokenizer.json").write_text(json.dumps(tokenizer, indent=2) + "\n")
    print(f"wrote {args.format} checkpoint of {ckpt} to {out}")
    if args.format == "compressed-tensors":
        print(
            "load it with vLLM, fp4_compile.load_nvfp4_checkpoint, or transformers' "
            "from_pretrained (which needs compressed-tensors: pip install 'minite[ct]'; "
            "docs/checkpoints.md)"
        )
    return 0
