"""The rollout engine's decode step as a CUDA graph (`RolloutEngine(..., cuda_graphs=True)`).

Decode at small batch is bound by host time: every op of the compiled step is a Python call and
a kernel launch (~0.1-0.5 ms each on the H200 for the NVFP4 ops), while the GPU waits. Captured
once per `generate` call, the step replays as one graph launch.

Why the bits do not change: a replay runs exactly the kernels the captured call launched, with
the same arguments, on the same buffers; only the three per-token inputs (token ids, positions,
kv lengths) are copied into the captured input tensors first. The step must therefore read no
device data on the host (nothing in the lowered CUDA path does; a host read inside the capture
raises, it does not fall back), and the quantized weights must be in the engine's weight cache
already (a cache miss inside a capture would store tensors the capture never computed: the
cache refuses it, see `WeightCache.hits_only`). The graph holds this call's KV cache by address
and is dropped with the call; `update_weights` between calls therefore needs nothing more.
"""

from __future__ import annotations

import torch


class DecodeGraph:
    def __init__(self, step, weight_cache, cache, batch: int, device: torch.device):
        self.ids = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.positions = torch.zeros((batch, 1), dtype=torch.long, device=device)
        self.kv_len = torch.ones((batch,), dtype=torch.long, device=device)
        self.graph = torch.cuda.CUDAGraph()
        torch.cuda.synchronize(device)
        try:
            with weight_cache.hits_only(), torch.cuda.graph(self.graph):
                self.logits = step(self.ids, self.positions, self.kv_len, cache)
        except Exception as e:
            raise RuntimeError(
                "capturing the decode step as a CUDA graph failed (an op of the step syncs with "
                f"the host or misses the weight cache); run with cuda_graphs=False: {e}"
            ) from e

    def __call__(self, ids_B: torch.Tensor, cur_B: torch.Tensor) -> torch.Tensor:
        """Replay for token ids [B] at positions cur [B] (kv length cur + 1): logits [B, 1, V],
        overwritten by the next replay."""
        self.ids.copy_(ids_B[:, None])
        self.positions.copy_(cur_B[:, None])
        self.kv_len.copy_(cur_B + 1)
        self.graph.replay()
        return self.logits
