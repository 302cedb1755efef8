"""Ctrl-C in `minite train` (rl/train/interrupt.py). Contract: the first Ctrl-C ends the run after
the step in progress with a checkpoint of it, the summary and the plots, exit status 130, and
prints the command that continues the run, which then does; a second Ctrl-C stops at once and
still writes the summary and plots of the steps logged and names the checkpoint --resume
continues from."""

import shlex
import signal

from test_run_dir import CHEAP

from fp4_compile.cli import main
from fp4_compile.rl.train import trainer as trainer_module


def _interrupt_at(monkeypatch, call: int, times: int):
    """Press Ctrl-C `times` times during the `call`-th GRPO step (1-based)."""
    original = trainer_module.GRPOTrainer.train_step
    calls = []

    def train_step(self):
        calls.append(1)
        if len(calls) == call:
            for _ in range(times):
                signal.raise_signal(signal.SIGINT)
        return original(self)

    monkeypatch.setattr(trainer_module.GRPOTrainer, "train_step", train_step)


def test_first_ctrl_c_stops_after_the_step_and_says_how_to_continue(tmp_path, monkeypatch, capsys):
    run = tmp_path / "r"
    _interrupt_at(monkeypatch, call=1, times=1)
    assert (
        main(["train", "tiny", *CHEAP, "steps=3", "checkpoint_every=10", f"out_dir={run}"]) == 130
    )
    captured = capsys.readouterr()
    assert "stopping after the step in progress" in captured.err
    assert "stopped by Ctrl-C after step 1 of 3; checkpoint saved" in captured.out
    assert (run / "checkpoints" / "step_00000001.ckpt").is_file()
    assert (run / "summary.txt").is_file() and list(run.glob("*.png"))
    command = captured.out.strip().splitlines()[-1].strip()
    assert command.endswith("--resume") and f"out_dir={run}" in command, command
    monkeypatch.undo()
    assert main(shlex.split(command)[1:]) == 0  # the printed command continues the run
    assert (run / "checkpoints" / "step_00000003.ckpt").is_file()


def test_second_ctrl_c_stops_at_once_and_keeps_what_was_done(tmp_path, monkeypatch, capsys):
    run = tmp_path / "r"
    _interrupt_at(monkeypatch, call=2, times=2)
    argv = ["train", "tiny", *CHEAP, "steps=3", "checkpoint_every=1", f"out_dir={run}"]
    assert main(argv) == 130
    captured = capsys.readouterr()
    assert "minite: interrupted" in captured.err
    assert "interrupted after 1 step(s); the last checkpoint is step_00000001.ckpt" in captured.out
    assert "--resume" in captured.out.strip().splitlines()[-1]
    assert (run / "summary.txt").is_file() and list(run.glob("*.png"))
