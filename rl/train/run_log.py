"""Logs of a GRPO run: one JSON line per step (metrics.jsonl), TensorBoard scalars when the
`tensorboard` package is installed (one line says so when it is not), a progress bar, PNG plots
and a one-screen summary at the end."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from pathlib import Path

# file -> (title, curves, caption); a curve is (metric, legend label, offset subtracted from it)
PLOTS = {
    "reward.png": (
        "reward",
        [
            ("reward/mean", "reward/mean", 0.0),
            ("reward/exact_frac", "reward/exact_frac", 0.0),
            ("eval/accuracy", "eval/accuracy (held-out, greedy)", 0.0),
            ("eval/reward", "eval/reward (held-out, greedy)", 0.0),
        ],
        "higher is better; 1 = every answer right",
    ),
    "mismatch.png": (
        "learner vs rollout mismatch (0 = identical)",
        [
            ("mismatch/max_abs_dlogp", "max |logp_learner - logp_rollout|", 0.0),
            ("rollout_corr/k3_kl", "rollout_corr/k3_kl (k3 KL, never < 0)", 0.0),
            ("token_mult_prob_error", "token_mult_prob_error - 1 (NeMo flags > 0.05)", 1.0),
        ],
        "strict: every curve exactly 0 (bitwise). te: small, > 0, corrected by TIS",
    ),
    "throughput.png": (
        "throughput per phase",
        [
            ("perf/rollout_tokens_per_s", "rollout tokens/s", 0.0),
            ("perf/learner_tokens_per_s", "learner tokens/s", 0.0),
        ],
        "step 0 includes compilation",
    ),
    "step_time.png": (
        "time per phase (s)",
        [
            ("perf/step_s", "whole step", 0.0),
            ("perf/rollout_s", "rollout", 0.0),
            ("perf/learner_s", "learner", 0.0),
        ],
        "step 0 includes compilation",
    ),
}


def step_records(records: list[dict]) -> list[dict]:
    """The records of GRPO steps: all but the last one of a run that evaluates (eval_every > 0),
    which holds only `step` (= steps, the final weights) and the eval/ metrics."""
    return [r for r in records if "reward/mean" in r]


def read_jsonl(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class RunLogger:
    """metrics.jsonl (+ TensorBoard) under `out_dir`. `resume_step` keeps the records of steps
    < resume_step and drops the rest (a run stopped after its last checkpoint re-logs them)."""

    def __init__(self, out_dir: str | Path, *, resume_step: int | None = None, log=print):
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "metrics.jsonl"
        kept = [
            r for r in read_jsonl(self.path) if resume_step is not None and r["step"] < resume_step
        ]
        with self.path.open("w") as f:
            for r in kept:
                f.write(json.dumps(r) + "\n")
        self._file = self.path.open("a")
        self.records: list[dict] = kept
        try:
            # lazy: tensorboard is optional (not a dependency)
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log(
                "tensorboard: not installed, TensorBoard logs are OFF (pip install tensorboard); "
                "metrics.jsonl and the PNG plots are written"
            )
            self._tb = None
        else:
            self._tb = SummaryWriter(str(self.out_dir / "tensorboard"))

    def log(self, record: dict) -> None:
        self.records.append(record)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)) and math.isfinite(v):
                    self._tb.add_scalar(k, v, record["step"])

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()


class Heartbeat:
    """`with Heartbeat(log, every_s=10, what="compiling"):` logs "  ... still compiling (10 s)"
    every `every_s` seconds until the block ends, so a long silent phase (the first step's
    compilation: about 40 s on 2 CPU cores) shows it is alive. A daemon thread that only logs."""

    def __init__(self, log, *, every_s: float = 10.0, what: str = "compiling") -> None:
        if not every_s > 0:
            raise ValueError(f"every_s must be > 0, got {every_s!r}")
        self.log, self.every_s, self.what = log, every_s, what
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="minite-heartbeat")

    def _run(self) -> None:
        t0 = time.perf_counter()
        while not self._stop.wait(self.every_s):
            self.log(f"  ... still {self.what} ({time.perf_counter() - t0:.0f} s)")

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


class ProgressBar:
    """`step 12/40 [#####.....] reward 0.41 exact 0.38 gap 0 | 1.20s/step: rollout 0.80s (3.1k
    tok/s), learner 0.40s (9.8k tok/s) | eta 34s`: what each step costs and where it goes, from
    the first step on; redrawn in place on a terminal, one line every `every` steps otherwise."""

    def __init__(self, total: int, *, start: int = 0, stream=None, every: int = 1):
        self.total, self.start = total, start
        self.stream = stream if stream is not None else sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.every = every
        self.first: tuple[float, int] | None = None  # (time, steps done) after this run's 1st step

    def update(self, step: int, record: dict) -> None:
        done = step + 1
        width = 24
        fill = int(width * done / self.total)
        now = time.perf_counter()
        # this run's first step compiles the engine and the learner: the ETA leaves it out
        if self.first is None:
            self.first = (now, done)
            eta = "eta --" if done < self.total else "eta 0s"
        else:
            per_step = (now - self.first[0]) / (done - self.first[1])
            eta = f"eta {per_step * (self.total - done):.0f}s"
        gap = record.get("mismatch/max_abs_dlogp", float("nan"))
        text = (
            f"step {done}/{self.total} [{'#' * fill}{'.' * (width - fill)}] "
            f"reward {record['reward/mean']:.3f} exact {record['reward/exact_frac']:.2f} "
            f"gap {gap:.3g} | {_seconds(record['perf/step_s'])}/step: rollout "
            f"{_seconds(record['perf/rollout_s'])} ({_si(record['perf/rollout_tokens_per_s'])} "
            f"tok/s), learner {_seconds(record['perf/learner_s'])} "
            f"({_si(record['perf/learner_tokens_per_s'])} tok/s) | {eta}"
        )
        if self.tty:
            self.stream.write("\r" + text + "\x1b[K" + ("\n" if done == self.total else ""))
        elif done % self.every == 0 or done == self.total:
            self.stream.write(text + "\n")
        self.stream.flush()


def _seconds(x: float) -> str:
    return f"{x:.2f}s" if x < 10 else f"{x:.0f}s"


def _si(x: float) -> str:
    return f"{x / 1e3:.1f}k" if x >= 1e3 else f"{x:.0f}"


def write_plots(records: list[dict], out_dir: str | Path) -> list[Path]:
    """PNG curves (matplotlib, Agg backend) of reward, mismatch and throughput. A curve is drawn
    through the records that hold its metric (the eval/ ones every `eval_every` steps)."""
    import matplotlib  # lazy: matplotlib costs ~0.5 s at import; only the plots need it

    matplotlib.use("Agg", force=False)
    # lazy: matplotlib costs ~0.5 s at import; only the plots need it
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    written = []
    for filename, (title, curves, caption) in PLOTS.items():
        fig, ax = plt.subplots(figsize=(6, 3.5))
        for key, label, offset in curves:
            rows = [r for r in records if key in r]
            if not rows:
                continue
            steps, ys = [r["step"] for r in rows], [r[key] - offset for r in rows]
            ax.plot(steps, ys, label=label, marker="." if len(steps) < 60 else None)
        ax.set_title(title)
        ax.set_xlabel(f"step    ({caption})", fontsize=8)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        fig.tight_layout()
        path = out_dir / filename
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written


# (metric, its value when learner and rollout agree exactly, the worst end of its range): a
# token_mult_prob_error of 1 is perfect (NeMo RL's mean(exp|dlogp|)), not an error count
MISMATCH_SUMMARY = (
    ("mismatch/max_abs_dlogp", 0, max),
    ("mismatch/frac_bitwise_equal", 1, min),
    ("rollout_corr/k3_kl", 0, max),
    ("token_mult_prob_error", 1, max),
)


def summary(records: list[dict], *, title: str, extra: dict | None = None) -> str:
    """A one-screen text summary: reward at the start and end, mismatch, throughput."""
    if not records:
        return f"{title}: no steps logged"

    def avg(key, rows):
        vals = [r[key] for r in rows if key in r]
        return sum(vals) / len(vals) if vals else float("nan")

    steps = step_records(records)
    k = max(1, min(5, len(steps) // 4))
    first, last = steps[:k], steps[-k:]
    lines = [
        f"== {title} ==",
        f"steps {records[0]['step']}..{records[-1]['step']} ({len(records)} logged)",
    ]
    for key in ("reward/mean", "reward/exact_frac"):
        lines.append(f"{key:44s} first {k}: {avg(key, first):.3f}   last {k}: {avg(key, last):.3f}")
    for key in ("eval/accuracy", "eval/reward"):  # held-out, greedy: first vs last evaluation
        rows = [r for r in records if key in r]
        if rows:
            a, b = rows[0], rows[-1]
            lines.append(
                f"{key:44s} step {a['step']}: {a[key]:.3f}   step {b['step']}: {b[key]:.3f}"
            )
    # learner/rollout mismatch: each with the value identical engines give, and its worst value
    for key, ideal, worst in MISMATCH_SUMMARY:
        vals = [r[key] for r in records if key in r]
        if vals:
            label = f"{key} ({ideal} = identical)"
            lines.append(
                f"{label:44s} {worst.__name__} over run: {worst(vals):.3g}   last: {vals[-1]:.3g}"
            )
    # where a step's time goes (seconds), then throughput
    perf = (
        "perf/step_s",
        "perf/rollout_s",
        "perf/learner_s",
        "perf/eval_s",
        "perf/rollout_tokens_per_s",
        "perf/learner_tokens_per_s",
    )
    for key in perf:
        # the first steps compile; report the later ones
        rows = records[1:] if len(records) > 1 else records
        if any(key in r for r in records):
            lines.append(f"{key:44s} mean after step 0: {avg(key, rows):.4g}")
    for name, value in (extra or {}).items():
        lines.append(f"{name:44s} {value}")
    return "\n".join(lines)
