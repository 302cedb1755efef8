"""Analytic cost models of minite's steps (CPU, shapes only, no kernel runs): the lowered graphs
of the rollout step (`rollout.py`, whose docstring writes out the counting rules) and of the
learner step (`learner.py`), priced per kernel launch in bytes, FLOPs and roofline time.

- `rules.py`: one ATen graph -> one `OpCost` row per kernel; the roofline constants.
- `learner_rules.py`: the rows inside the NVFP4 GEMMs' backward ops.
- `weight_store.py`: the learner's weight store rewrite, once per optimizer step.
- `summary.py`: rows summed per step and per op; `models.py`: the models they price (meta).

The commands over them: `python -m benchmarks.step_cost` and `python -m
benchmarks.step_cost_learner`; docs/step_cost.md is the guide.
"""

from .learner import QUANTIZE_WEIGHTS, adamw_rows, at_micro_batches, learner_step_cost
from .models import BENCH_LAYERS, BUILTIN_NOTES, build_model
from .rollout import RECIPES, expert_fraction, step_cost
from .rules import OpCost
from .summary import by_op, constants, summarize

__all__ = [
    "BENCH_LAYERS",
    "BUILTIN_NOTES",
    "QUANTIZE_WEIGHTS",
    "RECIPES",
    "OpCost",
    "adamw_rows",
    "at_micro_batches",
    "build_model",
    "by_op",
    "constants",
    "expert_fraction",
    "learner_step_cost",
    "step_cost",
    "summarize",
]
