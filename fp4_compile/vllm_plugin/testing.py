"""Helpers for the vLLM tests and benchmarks (no pytest): the settings that make an in-process
vLLM engine start in seconds on CPU, and the learner's view under them."""

from __future__ import annotations

import contextlib
import os

import torch

from ..codegen import quantize_weight

# in-process engine core (LLM() starts in seconds, apply_model runs functions in this process)
IN_PROCESS_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def set_in_process_env() -> None:
    """Set the in-process engine variable unless the caller set it (call before creating LLM)."""
    for key, value in IN_PROCESS_ENV.items():
        os.environ.setdefault(key, value)


@contextlib.contextmanager
def dynamo_disabled(disabled: bool):
    """torch.compile on (the learner's minite backend) or off (vLLM's sampler compiles a helper
    with Inductor: 13-33 s cold on this CPU, and not what a test measures), for the block."""
    with torch._dynamo.config.patch(disable=disabled):
        yield


def small_llm(
    folder,
    *,
    dtype: str = "float32",
    max_model_len: int = 256,
    max_num_seqs: int = 32,
    kv_cache_bytes: int = 64 << 20,
    **kwargs,
):
    """vLLM's LLM for a tiny model folder: eager, no tokenizer, a fixed KV cache size."""
    from vllm import LLM  # lazy: vllm is optional (the vllm extra)

    set_in_process_env()
    with dynamo_disabled(True):
        return LLM(
            str(folder),
            skip_tokenizer_init=True,
            dtype=dtype,
            enforce_eager=True,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            kv_cache_memory_bytes=kv_cache_bytes,
            seed=0,
            **kwargs,
        )


def learner_shards_q(params: dict, shards, recipe) -> list:
    """The learner's quantized weights of a fused vLLM layer's shards (`NVFP4Tensor` each): under
    the shards' shared global scale where `recipe.shared_weight_scale` groups them, as the
    lowering quantizes q/k/v and gate/up."""
    members = [params[f"{s}.weight"] for s in shards]
    group = members if len(members) > 1 and recipe.shared_weight_scale else None
    return [quantize_weight(w, recipe, group=group) for w in members]
