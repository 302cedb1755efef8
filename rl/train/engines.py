"""The rollout engines the GRPO trainer can run, by name: ONE table, `ENGINES`, that the settings
(`TrainConfig.rollout_engine`), the trainer and `minite train --help` read.

Every engine implements `fp4_compile.engine_api.RolloutEngineProtocol` (`generate` over any number
of requests, `update_weights`), so the trainer treats them all alike: it builds one with
`build_engine(name, EngineRequest(...))` and calls `generate` once per rollout batch. vLLM is an
optional dependency: its engine is imported only when built.

To add an engine: a class with that interface (its `generate` starts with
`fp4_compile.engine_api.check_generate_args`), a builder below, one row in `ENGINES`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ...engine_api import RolloutEngineProtocol
from ...recipe import NVFP4Recipe
from ...rollout import RolloutEngine
from ...vllm_plugin.engine import VLLMRolloutEngine
from .stock_rollout import StockRolloutEngine


@dataclass(frozen=True, kw_only=True)
class EngineRequest:
    """What the trainer hands a builder: the learner and the run's settings an engine needs."""

    model: torch.nn.Module
    """The learner's module (FP32 master weights); an engine takes its own copy of them."""
    recipe: NVFP4Recipe
    """The learner's numerics."""
    device: torch.device
    max_batch: int
    """Requests run at once (the KV cache rows); `generate` takes any number."""
    max_seq_len: int
    """Longest prompt + the response budget."""
    seed: int
    """The run's seed (vLLM's engine seed)."""
    temperature: float
    """The run's sampling temperature (vLLM's full model class computes log-probs at it)."""
    compile: bool
    """False: eager FP32 on both sides (loop-logic tests), no NVFP4."""
    cuda_graphs: bool
    """The embedded engine's CUDA-graph decode (`rollout_cuda_graphs`)."""
    weights: str = "bf16+packed"
    """The embedded engine's weight copy (`rollout_weights`, `RolloutEngine(weights=...)`)."""
    kv_tokens: int = 0
    """The embedded engine's paged KV cache size in tokens (`rollout_kv_tokens`); 0: static."""


@dataclass(frozen=True)
class EngineEntry:
    build: Callable[[EngineRequest], RolloutEngineProtocol]
    summary: str
    """One line for `minite train --help` and the settings' errors."""
    one_process: bool = False
    """The engine cannot run beside an FSDP2-sharded learner (--nproc > 1 is refused)."""
    cuda_graphs: bool = False
    """The engine takes `rollout_cuda_graphs=True`."""


def _minite(req: EngineRequest) -> RolloutEngineProtocol:
    return RolloutEngine(
        copy.deepcopy(req.model),
        recipe=req.recipe,
        device=req.device,
        max_batch=req.max_batch,
        max_seq_len=req.max_seq_len,
        compile=req.compile,
        cuda_graphs=req.cuda_graphs,
        weights=req.weights,
        **(dict(kv_cache="paged", kv_tokens=req.kv_tokens) if req.kv_tokens else {}),
    )


def _vllm(req: EngineRequest, *, full: bool | None, name: str) -> RolloutEngineProtocol:
    if full and not req.compile:
        raise ValueError(f"rollout_engine={name!r} runs minite's numerics: compile=True")
    # vLLM loads the weights from a folder it writes; compile=False runs vLLM's own path
    return VLLMRolloutEngine(
        req.model,
        recipe=req.recipe if req.compile else None,
        max_batch=req.max_batch,
        max_seq_len=req.max_seq_len,
        seed=req.seed,
        full=full,
        temperature=req.temperature,
    )


def _stock(req: EngineRequest) -> RolloutEngineProtocol:
    return StockRolloutEngine(
        req.model,
        recipe=req.recipe,
        device=req.device,
        max_batch=req.max_batch,
        max_seq_len=req.max_seq_len,
    )


ENGINES: dict[str, EngineEntry] = {
    "minite": EngineEntry(
        _minite,
        "the embedded engine: continuous batching, learner == rollout bitwise",
        cuda_graphs=True,
    ),
    "vllm": EngineEntry(
        lambda req: _vllm(req, full=None, name="vllm"),
        "vLLM with minite's plugin: the model class where one exists (bitwise), else linears",
        one_process=True,
    ),
    "vllm_full": EngineEntry(
        lambda req: _vllm(req, full=True, name="vllm_full"),
        "vLLM with minite's model class (bitwise) or an error",
        one_process=True,
    ),
    "vllm_linears": EngineEntry(
        lambda req: _vllm(req, full=False, name="vllm_linears"),
        "vLLM with minite's linears only: close to the learner, not bitwise",
        one_process=True,
    ),
    "stock": EngineEntry(
        _stock,
        "the alignment ablation's mismatch: eager BF16 on the decoded NVFP4 weights (W4A16)",
        one_process=True,
    ),
}
"""name -> engine; `TrainConfig.rollout_engine` names one (docs/vllm.md, docs/alignment.md)."""


def engine_entry(name: str) -> EngineEntry:
    """The table's row of `name`, or a ValueError listing the names."""
    if name not in ENGINES:
        raise ValueError(f"rollout_engine must be one of {tuple(ENGINES)}, got {name!r}")
    return ENGINES[name]


def build_engine(name: str, req: EngineRequest, *, world: int = 1) -> RolloutEngineProtocol:
    """The engine `name` built for `req`; `world` learner processes (FSDP2)."""
    entry = engine_entry(name)
    if entry.one_process and world > 1:
        raise ValueError(f"rollout_engine={name!r} runs in one process ({world} were started)")
    if req.cuda_graphs and not entry.cuda_graphs:
        raise ValueError(f"rollout_cuda_graphs=True is for the embedded engine, not {name!r}")
    engine = entry.build(req)
    if not isinstance(engine, RolloutEngineProtocol):
        raise TypeError(
            f"rollout_engine={name!r} built a {type(engine).__name__}, which lacks "
            "generate / update_weights / max_batch / max_seq_len (RolloutEngineProtocol)"
        )
    return engine


def engines_help() -> str:
    """The table, one line per engine, for `minite train --help`."""
    return "rollout_engine=NAME (rl/train/engines.py): " + "; ".join(
        f"{name}: {entry.summary}" for name, entry in ENGINES.items()
    )
