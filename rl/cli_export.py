"""`minite export RUN_DIR_OR_CKPT --format compressed-tensors|modelopt --out DIR`.

Rebuilds the policy of a GRPO run's checkpoint (`runs/<name>/checkpoints/step_*.ckpt`, the
latest one when given the run folder) from the run's own config and recipe, and writes it with
`fp4_compile.export_checkpoint`. Wired into fp4_compile/cli.py by `add_export_parser` and
`run_export`, like `minite train`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from .checkpoint import latest_checkpoint, load_checkpoint
from .config import TrainConfig, build_model


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
    p.add_argument("--format", choices=["compressed-tensors", "modelopt"], required=True)
    p.add_argument("--out", required=True, help="new or empty folder for the checkpoint")
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
    raise ValueError(f"source {str(source)!r} is neither a checkpoint file nor a run folder "
                     "holding checkpoints/step_*.ckpt")  # fmt: skip


def policy_from_checkpoint(path: str | Path):
    """(model with the checkpoint's policy weights on CPU, recipe, tokenizer dict or None)."""
    from fp4_compile.recipe import NVFP4Recipe

    state = load_checkpoint(path, kind="grpo")
    cfg = TrainConfig.from_dict(state["config"])
    cfg = dataclasses.replace(cfg, device="cpu", rollout_cuda_graphs=False)
    vocab = state["model"]["model.embed_tokens.weight"].shape[0]
    model = build_model(cfg, vocab)
    model.load_state_dict(state["model"])
    return model, NVFP4Recipe.from_dict(state["recipe"]), state.get("tokenizer")


def run_export(args) -> int:
    from fp4_compile.checkpoints import export_checkpoint

    ckpt = resolve_checkpoint(args.source)
    model, recipe, tokenizer = policy_from_checkpoint(ckpt)
    if tokenizer is not None and tokenizer.get("kind") == "hf":  # a model=DIR run: its tokenizer
        from transformers import AutoTokenizer

        hf_tokenizer = AutoTokenizer.from_pretrained(tokenizer["path"])
        out = export_checkpoint(
            model, args.out, format=args.format, recipe=recipe, tokenizer=hf_tokenizer
        )
        tokenizer = None
    else:
        out = export_checkpoint(model, args.out, format=args.format, recipe=recipe)
    if tokenizer is not None:  # the run's own character tokenizer: not a transformers one
        (Path(out) / "minite_tokenizer.json").write_text(json.dumps(tokenizer, indent=2) + "\n")
    print(f"wrote {args.format} checkpoint of {ckpt} to {out}")
    return 0
