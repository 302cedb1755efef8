"""The `minite` command line."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minite", description="native NVFP4 RL of LLMs")
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
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run_demo

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
