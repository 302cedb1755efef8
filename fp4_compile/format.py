"""The NVFP4 storage format: E2M1 codes, nibble packing, and the `NVFP4Tensor` container.

Shape legend: R rows (all leading dimensions flattened), K the last (contraction) dimension.

- E2M1 code (4 bits): bits 0-2 index the magnitudes [0, 0.5, 1, 1.5, 2, 3, 4, 6]; bit 3 is the
  sign (code 8 is -0). No Inf, no NaN.
- Packing: two codes per byte along K, element 2i in the LOW nibble, element 2i+1 in the HIGH
  nibble (TransformerEngine, torchao, ModelOpt, compressed-tensors, vLLM).
- Block scales: one float8_e4m3fn per 16 consecutive elements along K, shape [..., K/16]. For
  16x16 weight tiles the tile's scale is stored repeated for each of its 16 rows, so every
  NVFP4Tensor has the same layout whatever its block shape.
- Global decode scale: float32, shape [] (per tensor or static) or [..., R, 1] (per row).

This module holds no numerics beyond exact table lookups; `reference.py` holds the quantizer.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

BLOCK_SIZE = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
FLT_MAX = torch.finfo(torch.float32).max

# Magnitudes of the 3-bit E2M1 codes; index with (code & 7).
E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

BLOCK_SHAPES = ("1x16", "16x16")
# The vocabulary of a tensor's global scale and of the element rounding (the recipe's fields and
# the reference quantizer's arguments use these words).
GLOBAL_SCALE_MODES = ("per_tensor", "per_row", "static")
ROUNDING_MODES = ("rne", "stochastic")


def e2m1_values(device: torch.device | str = "cpu") -> torch.Tensor:
    """All 16 code values as float32, index = code (codes 8..15 are the negatives, 8 is -0.0).
    Cached per device: a host-to-device copy per call would wait for the device's queue. The
    table is shared: never write to it."""
    return _e2m1_table(str(torch.device(device)))


@functools.cache
def _e2m1_table(device: str) -> torch.Tensor:
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def decode_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Unpacked codes (uint8, one per element) -> float32 values. Exact."""
    return e2m1_values(codes.device)[codes.long()]


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] uint8 codes (0..15) -> [..., K/2] bytes, element 2i in the low nibble."""
    if codes.shape[-1] % 2:
        raise ValueError(f"pack_codes: last dim must be even, got shape {tuple(codes.shape)}")
    low = codes[..., 0::2]
    high = codes[..., 1::2]
    return (low | (high << 4)).to(torch.uint8)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes -> [..., K] uint8 codes (inverse of `pack_codes`)."""
    low = packed & 0x0F
    high = packed >> 4
    return torch.stack([low, high], dim=-1).flatten(-2)


@dataclass(frozen=True, eq=False)
class NVFP4Tensor:
    """A quantized tensor: packed E2M1 codes, E4M3 block scales, an FP32 global decode scale.

    The logical value of element (..., k) is
        E2M1(code) * float(block_scales[..., k // 16]) * global_decode[...]
    where the first product is exact (the "on-grid" value, exact in BF16) and the second is one
    FP32 rounding. `shape` is the logical (unpacked) shape.
    """

    codes: torch.Tensor  # uint8 [..., K/2]
    block_scales: torch.Tensor  # float8_e4m3fn [..., K/16]
    global_decode: torch.Tensor  # float32 [] or [..., R, 1]
    shape: tuple[int, ...]
    block: str = "1x16"

    def __post_init__(self) -> None:
        assert self.codes.dtype == torch.uint8, self.codes.dtype
        assert self.block_scales.dtype == torch.float8_e4m3fn, self.block_scales.dtype
        assert self.global_decode.dtype == torch.float32, self.global_decode.dtype
        assert self.block in BLOCK_SHAPES, self.block
        k = self.shape[-1] if self.shape else 0
        assert tuple(self.codes.shape) == (*self.shape[:-1], k // 2), (self.codes.shape, self.shape)
        assert tuple(self.block_scales.shape) == (*self.shape[:-1], k // BLOCK_SIZE)

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def is_per_row(self) -> bool:
        return self.global_decode.dim() > 0

    def unpacked_codes(self) -> torch.Tensor:
        """[..., K] uint8 codes."""
        return unpack_codes(self.codes)

    def on_grid(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """E2M1 value x E4M3 block scale, without the global scale. Exact in float32 and bf16."""
        values = decode_e2m1(self.unpacked_codes())
        scales = self.block_scales.to(torch.float32).repeat_interleave(BLOCK_SIZE, dim=-1)
        return (values * scales).to(dtype)

    def to(self, device: torch.device | str) -> NVFP4Tensor:
        return NVFP4Tensor(
            codes=self.codes.to(device),
            block_scales=self.block_scales.to(device),
            global_decode=self.global_decode.to(device),
            shape=self.shape,
            block=self.block,
        )

    def __getitem__(self, index) -> NVFP4Tensor:
        """Index leading dimensions (rows, experts); the last dimension is never indexed."""
        if not isinstance(index, tuple):
            index = (index,)
        codes = self.codes[index]
        scales = self.block_scales[index]
        gd = self.global_decode[index] if self.is_per_row else self.global_decode
        shape = (*codes.shape[:-1], self.shape[-1])
        return NVFP4Tensor(
            codes=codes, block_scales=scales, global_decode=gd, shape=shape, block=self.block
        )

    def __repr__(self) -> str:  # never dequantizes
        mode = "per_row" if self.is_per_row else "per_tensor"
        return (
            f"NVFP4Tensor(shape={list(self.shape)}, block={self.block}, global={mode}, "
            f"device={self.device})"
        )

    def bytes_equal(self, other: NVFP4Tensor) -> bool:
        """Bitwise equality of every stored byte (codes, scales, global scales) and the metadata."""
        return (
            self.shape == other.shape
            and self.block == other.block
            and torch.equal(self.codes, other.codes)
            and torch.equal(
                self.block_scales.view(torch.uint8), other.block_scales.view(torch.uint8)
            )
            and self.global_decode.shape == other.global_decode.shape
            and torch.equal(
                self.global_decode.view(torch.int32), other.global_decode.view(torch.int32)
            )
        )
