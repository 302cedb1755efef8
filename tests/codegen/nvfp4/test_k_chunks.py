"""The GEMMs' K-chunked summation order (configs.py 1., `nvfp4/k_chunks.py`) in the Triton
interpreter (on a GPU: compiled): the learner's GEMM (packed and on-grid B, dense and grouped)
and the decode GEMM at every split count give the chunked reference's bits.

The data makes the order visible and nothing else: every block of 16 holds codes of 0 / +-1 /
+-2 / +-4 times a power-of-two scale that depends on (row, chunk) for A and (16-row tile, chunk)
for B, so every partial sum inside a chunk is an exact multiple of that chunk's scale (any
summation order inside a chunk, numpy's or the tensor core's, gives the same chunk partial),
while chunk 0's products are 2**16 and the others' 2**-16 .. 2**4, so the fold of the chunk
partials rounds, and rounds differently from one rounding of the exact dot and from a fold of
half chunks: every test checks that its own data tells the orders apart (`_visible`)."""

import os

import pytest
import torch

from fp4_compile.codegen import configs
from fp4_compile.codegen.configs import DecodeConfig, k_chunk
from fp4_compile.codegen.nvfp4 import reference as nref
from fp4_compile.format import NVFP4Tensor, pack_codes
from fp4_compile.testing import assert_bitwise_equal

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
    reason="needs CUDA or TRITON_INTERPRET=1",
)
DEV = "cuda" if torch.cuda.is_available() else "cpu"
ARCH = "sm_90" if DEV == "cuda" else "interpreter"
# sm_90 pins one chain (configs.K_CHUNK, KC 0): on CUDA the module runs the order as a what-if
# at KC 1024 (`_what_if_chunk`), the size measured in benchmarks/results/2026-12-06_decode_gemm_9ab3c45.md
PINNED_KC = k_chunk(ARCH, "nvfp4_gemm")
KC = PINNED_KC or 1024


@pytest.fixture(autouse=True)
def _what_if_chunk():
    """Where the architecture pins one chain, both forward ops (the learner's GEMM and the
    decode) take KC for the test: the order under test, not the pinned one."""
    with configs.what_if_k_chunk(ARCH, KC):
        yield


CODES = torch.tensor([0, 2, 4, 6, 10, 12, 14])  # E2M1 codes of 0, 1, 2, 4, -1, -2, -4
VALUES = torch.tensor([0.0, 1, 2, 4, -1, -2, -4])


def _pow2_blocks(rows, k, row_group, seed):
    """(E2M1 code ints [rows, K], E4M3 scales [rows, K/16], on-grid FP32 values [rows, K]): one
    power-of-two scale per (row group, chunk of KC), 2**8 in chunk 0, 2**-8 .. 2**2 after it;
    codes 0 / +-1 / +-2 / +-4."""
    g = torch.Generator().manual_seed(seed)
    pick = torch.randint(0, len(CODES), (rows, k), generator=g)
    chunks = -(-k // KC)
    exps = torch.randint(-8, 3, (-(-rows // row_group), chunks), generator=g)
    exps[:, 0] = 8
    exps = exps.repeat_interleave(row_group, 0)[:rows]
    block_exp = exps.repeat_interleave(KC // 16, 1)[:, : k // 16]
    scales = (2.0 ** block_exp.float()).to(torch.float8_e4m3fn)
    values = VALUES[pick] * (2.0 ** block_exp.float()).repeat_interleave(16, 1)
    return CODES[pick], scales, values


def _weight(e, n, k, seed):
    codes, scales, values = _pow2_blocks(max(e, 1) * n, k, 16, seed)
    shape = (e, n, k) if e else (n, k)
    gd = torch.rand(max(e, 1), 1, 1, generator=torch.Generator().manual_seed(seed)) + 0.5
    w = NVFP4Tensor(
        codes=pack_codes(codes.to(torch.uint8)).reshape(*shape[:-1], k // 2),
        block_scales=scales.reshape(*shape[:-1], k // 16),
        global_decode=gd.reshape(e, 1, 1) if e else gd.reshape(()),
        shape=shape,
        block="16x16",
    )
    return w, values.reshape(shape)


def _activation(m, k, seed):
    _, _, values = _pow2_blocks(m, k, 1, seed)
    gd = torch.rand(m, 1, generator=torch.Generator().manual_seed(seed + 100)) + 0.5
    return values, gd


def _want(a, gd_a, b, gd_b, bias, kc=KC):
    y = nref.apply_global_scales(nref.chunked_dot_ongrid(a, b, kc), gd_a, gd_b)
    return y + bias if bias is not None else y


def _visible(a, b):
    """The test's data tells the chunked order from a fold of half chunks (so a kernel with
    another order would fail it)."""
    assert (nref.chunked_dot_ongrid(a, b, KC) != nref.chunked_dot_ongrid(a, b, KC // 2)).any()


def _packed(w):
    return (w.codes.to(DEV), w.block_scales.view(torch.uint8).to(DEV))


@pytest.mark.parametrize("k", [4 * KC, 4 * KC - 32])
def test_data_tells_the_orders_apart(k):
    """The check below could fail: the chunked order differs from one rounding of the exact
    dot and from a fold of smaller pieces on this data."""
    a, _ = _activation(8, k, 1)
    _, b = _weight(0, 48, k, 2)
    chunked = nref.chunked_dot_ongrid(a, b, KC)
    assert (chunked != nref.exact_dot_ongrid(a, b)).any()
    assert (chunked != nref.chunked_dot_ongrid(a, b, KC // 2)).any()


@pytest.mark.parametrize("m", [1, 3, 20])
@pytest.mark.parametrize("k", [4 * KC, 4 * KC - 32])
@pytest.mark.parametrize("b_form", ["packed", "ongrid"])
def test_learner_gemm_is_the_chunked_order(m, k, b_form):
    from fp4_compile.codegen.nvfp4.gemm_kernel import launch_gemm

    a, gd_a = _activation(m, k, 3 + m)
    w, b = _weight(0, 48, k, 4)
    bias = torch.randn(48, generator=torch.Generator().manual_seed(5))
    _visible(a, b)
    b_arg = _packed(w) if b_form == "packed" else b.to(DEV)
    got = launch_gemm(
        a.to(DEV),
        gd_a.to(DEV),
        b_arg,
        w.global_decode.to(DEV),
        bias=bias.to(DEV),
        out_dtype=torch.float32,
        config_op=None if b_form == "packed" else "nvfp4_gemm_ongrid",
    )
    assert_bitwise_equal(got.cpu(), _want(a, gd_a, b, w.global_decode, bias), f"{b_form} B")


def _decode(a, gd_a, w, **kw):
    from fp4_compile.codegen.nvfp4.decode_gemm_kernel import launch_decode_gemm

    return launch_decode_gemm(
        a.to(DEV), gd_a.to(DEV), _packed(w), w.global_decode.to(DEV), out_dtype=torch.float32, **kw
    ).cpu()


DECODE_CONFIGS = [
    DecodeConfig(16, 32, 32, num_warps=1, num_stages=1),
    DecodeConfig(16, 32, 64, num_warps=1, num_stages=1),
    DecodeConfig(16, 32, 64, num_warps=1, num_stages=1, weights_right=True),
]
if DEV == "cuda":  # the pinned sm_90 buckets (wgmma: >= 64 rows on the MMA's left operand)
    DECODE_CONFIGS = [
        DecodeConfig(16, 64, 128),
        DecodeConfig(64, 64, 128),
        DecodeConfig(64, 64, 128, weights_right=True),
    ]


@pytest.mark.parametrize("cfg", DECODE_CONFIGS, ids=str)
@pytest.mark.parametrize("m", [1, 5])
def test_decode_every_split_is_the_chunked_order(cfg, m):
    k = 4 * KC
    a, gd_a = _activation(m, k, 6 + m)
    w, b = _weight(0, 80, k, 7)
    bias = torch.randn(80, generator=torch.Generator().manual_seed(8))
    _visible(a, b)
    want = _want(a, gd_a, b, w.global_decode, bias)
    for splits in (1, 2, 3, 4):  # 3: runs of 2 chunks, so 2 programs
        got = _decode(a, gd_a, w, bias=bias.to(DEV), config=cfg, splits=splits)
        assert_bitwise_equal(got, want, f"{cfg} splits={splits}")


@pytest.mark.parametrize("splits", [1, 2, 4])
def test_grouped_gathered_decode_every_split(splits):
    """MoE: three experts (one empty), rows gathered by index (-1: a zero row), per-expert
    global decode; the fold kernel finds each row's expert as the GEMM did."""
    e, n, k = 3, 32, 4 * KC
    a, gd_a = _activation(24, k, 9)
    w, b = _weight(e, n, k, 10)
    offs = torch.tensor([9, 9, 24], dtype=torch.int32)
    idx = torch.randperm(24, generator=torch.Generator().manual_seed(11)).to(torch.int32)
    idx[[2, 15]] = -1
    got = _decode(
        a,
        gd_a,
        w,
        offsets=offs.to(DEV),
        a_rows=idx.to(DEV),
        config=DECODE_CONFIGS[0],
        splits=splits,
    )
    keep = (idx >= 0)[:, None]
    a_rows = torch.where(keep, a[idx.clamp(min=0).long()], 0.0)
    _visible(a_rows, b.reshape(e * n, k))
    gd_rows = torch.where(keep, gd_a[idx.clamp(min=0).long()], 1.0)
    start = 0
    for i, end in enumerate(offs.tolist()):
        want = _want(
            a_rows[start:end], gd_rows[start:end], b[i], w.global_decode[i].reshape(()), None
        )
        assert_bitwise_equal(got[start:end], want, f"expert {i} splits={splits}")
        start = end


def test_split_arguments_are_checked():
    a, gd_a = _activation(2, 2 * KC, 12)
    w, _ = _weight(0, 32, 2 * KC, 13)
    with pytest.raises(ValueError, match="splits=3"):
        _decode(a, gd_a, w, config=DECODE_CONFIGS[0], splits=3)
    with pytest.raises(ValueError, match="splits=0"):
        _decode(a, gd_a, w, config=DECODE_CONFIGS[0], splits=0)
    wide = DecodeConfig(16, 32 if DEV == "cpu" else 64, 2 * KC, num_warps=1, num_stages=1)
    with pytest.raises(ValueError, match="BLOCK_K"):
        _decode(a, gd_a, w, config=wide)


def test_what_if_k_chunk_restores_the_pinned_order_and_checks_kc():
    """`configs.what_if_k_chunk` (pytest --k-chunk, the benchmarks' --k-chunk): both forward ops
    take KC inside the block, the weight gradient keeps its own order, the pinned rows come back
    after (this module's fixture already holds KC); a KC that some BLOCK_K does not divide is
    refused before anything changes."""
    ops = (*configs.FORWARD_GEMM_OPS, "nvfp4_wgrad")
    before = {op: k_chunk(ARCH, op) for op in ops}
    with configs.what_if_k_chunk(ARCH, 2 * KC):
        assert [k_chunk(ARCH, op) for op in ops] == [2 * KC, 2 * KC, before["nvfp4_wgrad"]]
    assert {op: k_chunk(ARCH, op) for op in ops} == before
    with pytest.raises(ValueError, match="kc=24"), configs.what_if_k_chunk(ARCH, 24):
        pass
    assert {op: k_chunk(ARCH, op) for op in ops} == before
