"""Peak memory of the learner's log-prob pass at a full vocabulary (151,936) on the CPU: the
row-chunked head (`fp4_compile/rollout/learner_head.py`) against the full-logits path.

A Qwen3 of small width (hidden 64, 1 layer) but the real vocabulary, compiled with the minite
backend (strict recipe), computes the log-probs of 4 x 1024 tokens and their backward; each path
runs in its own process, once to compile, then again measured: its peak RSS (VmHWM, reset before
the pass) above the RSS the pass started from (Linux). The [tokens x vocabulary] FP32 logits alone are 2.49 GB; the chunked head holds
one chunk of them at a time.

    python -m benchmarks.learner_memory [--chunk-rows 512] [--skip-full]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

VOCAB, HIDDEN, SEQS, TOKENS = 151936, 64, 4, 1024


def _reset_peak_rss() -> None:
    """Linux: restart the process's peak-RSS mark (VmHWM) from its current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _peak_rss_gib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**20  # kB
    raise RuntimeError("no VmHWM in /proc/self/status")


def _current_rss_gib() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**30


def one_path(chunk_rows: int | None) -> dict:
    """Runs in a child process: build, compile, log-probs + backward; the RSS figures."""
    import torch

    from fp4_compile import NVFP4Recipe
    from fp4_compile.models import tiny_qwen3
    from fp4_compile.rollout import sequence_logprobs

    torch.manual_seed(0)
    model = tiny_qwen3(vocab=VOCAB, hidden=HIDDEN, layers=1).eval()
    learner = torch.compile(model, backend="minite", options={"recipe": NVFP4Recipe.strict()})
    seqs = torch.randint(0, VOCAB, (SEQS, TOKENS)).tolist()
    t0 = time.perf_counter()
    logp = sequence_logprobs(learner, seqs, [1] * SEQS, chunk_rows=chunk_rows)  # compiles
    torch.cat(logp).mean().backward()
    compile_seconds = time.perf_counter() - t0
    model.zero_grad(set_to_none=True)
    del logp
    _reset_peak_rss()  # the measured pass: compiled, caches warm
    base = _current_rss_gib()
    t0 = time.perf_counter()
    logp = sequence_logprobs(learner, seqs, [1] * SEQS, chunk_rows=chunk_rows)
    torch.cat(logp).mean().backward()
    seconds = time.perf_counter() - t0
    peak = _peak_rss_gib()
    return {
        "chunk_rows": chunk_rows,
        "rss_before_pass_gib": round(base, 3),
        "peak_rss_gib": round(peak, 3),
        "peak_above_build_gib": round(peak - base, 3),
        "seconds": round(seconds, 1),
        "first_pass_seconds_with_compile": round(compile_seconds, 1),
        "finite": bool(torch.isfinite(torch.cat(logp)).all()),
    }


def _child(chunk_rows: int | None) -> dict:
    arg = "none" if chunk_rows is None else str(chunk_rows)
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.learner_memory", "--child", arg],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk-rows", type=int, default=512)
    parser.add_argument("--skip-full", action="store_true", help="only the chunked path")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(one_path(None if args.child == "none" else int(args.child))))
        return
    from benchmarks.common import environment, write_results

    env = environment()
    logits_gib = SEQS * TOKENS * VOCAB * 4 / 2**30
    runs = [_child(args.chunk_rows)] + ([] if args.skip_full else [_child(None)])
    lines = [
        "# Learner log-prob pass at a full vocabulary: peak memory (CPU)",
        "",
        f"Qwen3, hidden {HIDDEN}, 1 layer, vocabulary {VOCAB}, strict recipe; {SEQS} x {TOKENS} "
        f"tokens, log-probs + backward. FP32 logits of these tokens: {logits_gib:.2f} GiB. "
        f"torch {env.get('torch')}, commit {env.get('commit')}.",
        "",
        "| path | peak RSS above the pass's start (GiB) | vs FP32 logits | s (compiled) |",
        "| --- | --- | --- | --- |",
    ]
    for r in runs:
        name = "full logits" if r["chunk_rows"] is None else f"row chunks of {r['chunk_rows']}"
        lines.append(
            f"| {name} | {r['peak_above_build_gib']:.2f} | "
            f"{r['peak_above_build_gib'] / logits_gib:.2f}x | {r['seconds']} |"
        )
    print("\n".join(lines))
    payload = {"env": env, "fp32_logits_gib": logits_gib, "runs": runs}
    for path in write_results("learner_memory", payload, "\n".join(lines) + "\n"):
        print("wrote", path)


if __name__ == "__main__":
    main()
