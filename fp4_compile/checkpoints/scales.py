"""Global-scale conventions of the checkpoint formats.

minite stores the DECODE global scale `gd = fp32(1 / ge)` where `ge = fp32(448*6 / amax)` is the
TransformerEngine-order encode scale. ModelOpt's `weight_scale_2` is that decode scale as is.
compressed-tensors stores the ENCODE scale and engines invert it once on load (vLLM:
`1 / weight_global_scale` in FP32). `encode_for_decode` returns an FP32 `ge` whose FP32
reciprocal is `gd` bit for bit (the learner's own `ge` is one; the search below finds one from
`gd` alone), so an engine that inverts once gets minite's decode scale exactly.
"""

from __future__ import annotations

import torch

_SEARCH_ULPS = 4


def encode_for_decode(gd: torch.Tensor) -> torch.Tensor:
    """FP32 [] encode scale `ge` with fp32(1 / ge) == gd bitwise (ValueError if none is near)."""
    gd = gd.reshape(()).to(torch.float32)
    one = torch.ones((), dtype=torch.float32)
    first = one / gd
    candidates = [first]
    up, down = first, first
    for _ in range(_SEARCH_ULPS):
        up = torch.nextafter(up, torch.tensor(float("inf")))
        down = torch.nextafter(down, torch.tensor(0.0))
        candidates += [up, down]
    for ge in candidates:
        if torch.equal((one / ge).view(torch.int32), gd.view(torch.int32)):
            return ge.clone()
    raise ValueError(
        f"global decode scale {gd.item()!r} has no FP32 encode scale within {_SEARCH_ULPS} ulps "
        "whose reciprocal is exact"
    )


def decode_for_encode(ge: torch.Tensor) -> torch.Tensor:
    """The decode scale an engine computes from an encode scale: fp32(1 / ge), one rounding."""
    return torch.ones((), dtype=torch.float32) / ge.reshape(()).to(torch.float32)
