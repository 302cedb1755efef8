"""The NVFP4 GEMM ops' operand checks and small shared helpers (CPU and CUDA paths alike).

Shape legend: M tokens, K in-features, N out-features, E experts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...format import BLOCK_SIZE, NVFP4Tensor
from ...recipe import NVFP4Recipe
from .gemm_call import decode_recipe as op_recipe  # noqa: F401  (the ops' one recipe decode)

X_DTYPES = (torch.bfloat16, torch.float32, torch.float16)


def act_global(recipe: NVFP4Recipe, x_amax: torch.Tensor | None):
    """The activation global-scale argument of `quantize` for this recipe."""
    mode = recipe.activation.global_scale
    if mode == "static":
        if x_amax is None:
            raise ValueError(
                "recipe.activation.global_scale='static' needs x_amax (a float32 scalar)"
            )
        return x_amax.reshape(())
    return mode


def weight_nk(w_codes, w_ongrid) -> tuple[int, int]:
    """(N, K) of a quantized weight: from its packed codes [.., N, K/2], or from its on-grid
    copy [.., N, K] when the codes hold no bytes ([.., N, 0]: quantized on-grid only)."""
    if w_codes.shape[-1] == 0 and w_ongrid is not None:
        return w_ongrid.shape[-2], w_ongrid.shape[-1]
    return w_codes.shape[-2], w_codes.shape[-1] * 2


def require_packed_bytes(w_codes) -> None:
    """Raise unless w_codes holds the packed bytes (paths that decode them)."""
    if w_codes.shape[-1] == 0:
        raise ValueError(
            "w_codes holds no packed bytes (a weight quantized on-grid only): this path reads "
            "the packed weight; quantize it with packed=True"
        )


def check_weight(x, w_codes, w_scales, w_gd, *, experts: bool, w_ongrid=None) -> tuple[int, int]:
    """Validate the quantized weight against x; returns (N, K). Codes and scales may be
    [.., N, 0] (no packed bytes) when w_ongrid, the on-grid copy [.., N, K], is given."""
    if not isinstance(x, torch.Tensor) or x.dtype not in X_DTYPES:
        raise TypeError(
            f"x must be a bfloat16/float32/float16 tensor, got {getattr(x, 'dtype', x)}"
        )
    rank = 3 if experts else 2
    if w_codes.dtype != torch.uint8 or w_codes.dim() != rank:
        raise TypeError(
            f"w_codes must be uint8 of rank {rank}, got {w_codes.dtype}{list(w_codes.shape)}"
        )
    if w_scales.dtype != torch.uint8:
        raise TypeError(f"w_scales must be the E4M3 scale bytes as uint8, got {w_scales.dtype}")
    if w_gd.dtype != torch.float32:
        raise TypeError(f"w_global_decode must be float32, got {w_gd.dtype}")
    if w_codes.shape[-1] == 0:
        if w_ongrid is None:
            raise ValueError(
                "w_codes holds no packed bytes ([.., N, 0]: a weight quantized on-grid only) "
                "and w_ongrid is None: pass the weight's on-grid copy as w_ongrid"
            )
        if w_ongrid.dtype != torch.bfloat16 or w_ongrid.shape[:-1] != w_codes.shape[:-1]:
            raise ValueError(
                f"w_ongrid must be bfloat16 [.., N, K] matching w_codes {tuple(w_codes.shape)}, "
                f"got {w_ongrid.dtype}{list(w_ongrid.shape)}"
            )
    n, k = weight_nk(w_codes, w_ongrid)
    if x.shape[-1] != k:
        raise ValueError(f"x last dim {x.shape[-1]} != weight in-features K={k}")
    want_scales = (*w_codes.shape[:-1], k // BLOCK_SIZE if w_codes.shape[-1] else 0)
    if tuple(w_scales.shape) != want_scales:
        raise ValueError(
            f"w_scales shape {tuple(w_scales.shape)} does not match w_codes {tuple(w_codes.shape)}"
        )
    return n, k


def weight_tensor(w_codes, w_scales, w_gd, n: int, k: int) -> NVFP4Tensor:
    """Rebuild the NVFP4Tensor from the op arguments (w_scales: E4M3 bytes as uint8)."""
    require_packed_bytes(w_codes)
    return NVFP4Tensor(
        codes=w_codes,
        block_scales=w_scales.view(torch.float8_e4m3fn),
        global_decode=w_gd,
        shape=(*w_codes.shape[:-2], n, k),
        block="16x16",
    )


def pad_tokens(t_RM: torch.Tensor) -> torch.Tensor:
    """Pad the last (token) dim with zeros to a multiple of 16 (zeros change no amax, no dot)."""
    pad = (-t_RM.shape[-1]) % BLOCK_SIZE
    return F.pad(t_RM, (0, pad)) if pad else t_RM


def gather_zero_rows(x2: torch.Tensor, x_index: torch.Tensor) -> torch.Tensor:
    """x2[x_index] with a zero row where x_index < 0 (the grouped ops' `x_index` semantics:
    the experts' token gather, masked rows zeroed), as a copy."""
    rows = x2[x_index.clamp(min=0)]
    return torch.where(
        (x_index >= 0).unsqueeze(-1), rows, torch.zeros((), dtype=x2.dtype, device=x2.device)
    )


def no_transposed_operand(x2):
    """The (X^T on-grid, global decode) pair of a graph that quantizes no X^T: [0] each."""
    return x2.new_empty((0,), dtype=torch.bfloat16), x2.new_empty((0,), dtype=torch.float32)
