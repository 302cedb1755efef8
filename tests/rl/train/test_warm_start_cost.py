"""What the warm start costs is said while it runs (rl/train/warm_start.py): after its first step
the log gives that step's time, the batch and width it ran at and the estimate of the whole warm
start; at the end the total and the per-step time, and that the next run loads it from the cache
(issue 57 item 13: a model with a long chat template ran its warm start for minutes silently)."""

import re

from fp4_compile.rl.tasks.builtin import make_task
from fp4_compile.rl.tasks.tokenizer import make_tokenizer
from fp4_compile.rl.train.config import build_model
from fp4_compile.rl.train.presets import get_preset
from fp4_compile.rl.train.warm_start import load_or_warm_start


def test_warm_start_logs_its_cost_and_loads_from_the_cache(tmp_path):
    cfg = get_preset("tiny").with_overrides(
        ["warm_start_steps=3", "warm_start_batch=4", f"cache_dir={tmp_path}"]
    )
    task = make_task(cfg.task, num_digits=cfg.num_digits)
    tok = make_tokenizer("", task)
    model = build_model(cfg, tok.padded_vocab_size(16))
    lines: list[str] = []
    first = load_or_warm_start(model, cfg, task, tok, log=lines.append)
    text = "\n".join(lines)
    assert re.search(
        r"warm start: steps 1-2 of 3 \(4 sequences x width \d+\) took \d+\.\d+ \+ \d+\.\d+ s; "
        r"about \d+ s in all",
        text,
    ), text
    assert re.search(r"loss \d\.\d{3} -> \d\.\d{3} in \d+\.\d s \(\d\.\d\d s/step\)", text), text
    assert not first["cached"] and first["seconds"] > 0
    lines.clear()
    again = load_or_warm_start(model, cfg, task, tok, log=lines.append)
    assert again["cached"] and again["seconds"] == 0.0
    assert lines and lines[0].startswith("warm start: loaded "), lines
