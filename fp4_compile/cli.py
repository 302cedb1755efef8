"""The `minite` command line. An error prints one line (`minite: error: ...`) and exits with
status 2; `--debug` shows the traceback instead."""

from __future__ import annotations

import argparse
import sys

from .demo import run_demo
from .rl.cli.export import add_export_parser, run_export
from .rl.cli.train import add_train_parser, run_train
from .rl.diagnostics.gap_report import run_diagnose


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    try:
        return _run(argv)
    except KeyboardInterrupt:
        print("minite: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # one line for the user; the traceback only when asked for
        if debug:
            raise
        cause = user_error(e)
        print(
            f"minite: error: {one_line(cause)} ({type(cause).__name__}; --debug shows the "
            "traceback)",
            file=sys.stderr,
        )
        return 2


def user_error(error: BaseException) -> BaseException:
    """The exception that says what went wrong: the backend's own error (a LoweringError, a
    ValueError naming a setting) rather than Dynamo's `BackendCompilerFailed` wrapper around it,
    whose message is only "backend='minite' raised:" followed by the cause on later lines."""
    seen: set[int] = set()
    while id(error) not in seen:
        seen.add(id(error))
        inner = getattr(error, "inner_exception", None)
        if isinstance(inner, BaseException):
            error = inner
        elif "BackendCompilerFailed" in type(error).__name__ and error.__cause__ is not None:
            error = error.__cause__
        else:
            break
    return error


def one_line(error: BaseException) -> str:
    """The whole message of `error` on one line (a multi-line message, e.g. a LoweringError's
    list of problems, joined with its lines' indentation collapsed; its report table left to
    --debug), never empty."""
    message = getattr(error, "summary", None) or str(error)
    text = " ".join(line.strip() for line in str(message).splitlines() if line.strip())
    return text or type(error).__name__


def build_parser() -> argparse.ArgumentParser:
    """The whole `minite` command line (tests/rl/cli/test_readme_commands.py parses the README's
    commands with it)."""
    parser = argparse.ArgumentParser(
        prog="minite",
        description="native NVFP4 RL of LLMs (add --debug anywhere to see tracebacks)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="quantize a real layer to NVFP4, report error, round-trip it"
    )
    demo.add_argument("--hidden", type=int, default=1024, help="in-features (Qwen3-0.6B: 1024)")
    demo.add_argument(
        "--intermediate", type=int, default=3072, help="out-features (Qwen3-0.6B: 3072)"
    )
    demo.add_argument("--tokens", type=int, default=64)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument(
        "--out", default=None, help="folder for the safetensors round trip (tmp if unset)"
    )
    diag = sub.add_parser(
        "diagnose", help="learner vs rollout log-prob gap: stock transformers vs minite strict/te"
    )
    diag.add_argument(
        "--model",
        default="tiny-qwen3",
        help="tiny-qwen3, tiny-qwen3-moe, a local transformers checkpoint folder (its "
        "weights), or a config.json (random weights of that config)",
    )
    diag.add_argument("--batch", type=int, default=8)
    diag.add_argument("--new-tokens", type=int, default=32)
    diag.add_argument("--temperature", type=float, default=1.0)
    diag.add_argument("--seed", type=int, default=0)
    diag.add_argument(
        "--out",
        default=None,
        help="results folder (default: runs/diagnose, or the next numbered runs/diagnose-N when "
        "that holds an earlier result); a folder holding a result needs --overwrite",
    )
    diag.add_argument("--overwrite", action="store_true", help="replace --out's earlier result")
    diag.add_argument(
        "--bf16-modules",
        default="",
        help="comma-separated fnmatch patterns of modules kept BF16 (added to the recipes' own), "
        "e.g. for a model whose sizes are not multiples of 16",
    )
    add_train_parser(sub)
    add_export_parser(sub)
    return parser


def _run(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "train":
        return run_train(args)
    if args.command == "export":
        return run_export(args)
    if args.command == "diagnose":
        run_diagnose(
            model=args.model,
            batch=args.batch,
            new_tokens=args.new_tokens,
            temperature=args.temperature,
            seed=args.seed,
            out_dir=args.out,
            overwrite=args.overwrite,
            bf16_modules=tuple(p.strip() for p in args.bf16_modules.split(",") if p.strip()),
        )
        return 0
    if args.command == "demo":
        return run_demo(
            hidden=args.hidden,
            intermediate=args.intermediate,
            num_tokens=args.tokens,
            seed=args.seed,
            out_dir=args.out,
        )
    return 2


if __name__ == "__main__":
    sys.exit(main())
