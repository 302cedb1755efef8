"""How minite's Triton kernels load their operands on sm_90, without a GPU: each kernel is
compiled for an H200 target (`triton.compile` on an `ASTSource`, this machine's Triton and its
bundled ptxas) with the arguments a learner-shaped launch passes, specialized as Triton's
launcher would (pointers and multiples of 16 marked divisible by 16, ints equal to 1 constant);
then its PTX is counted: asynchronous 16-byte copies (`cp.async.cg`, the software pipeline),
bulk tensor copies (TMA), vector and scalar global loads, and wgmma / mma.sync instructions.

Scalar 2-byte global loads in a GEMM's main loop mean no pipelining and no vectorization: the
MoE wgrad kernel compiled that way until 2026-12-04 (96 `ld.global.b16`, 0 `cp.async`),
because its K-tail mask `kk < width` had unknown granularity; `width` said to be a multiple of
16 gives 36 `cp.async.cg`. Counts are a property of the generated code, not a time: measure
speed on the GPU. (The device runs Triton 3.6, this machine 3.7: the code can differ.)

    python -m tools.ptx_audit [--json]

Run it in its own process without TRITON_INTERPRET (kernel modules decide at import whether
they are interpreted; the tests call it as a subprocess).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field

PATTERNS = {
    "cp.async 16B": r"cp\.async\.cg\.shared\.global",
    "cp.async (other)": r"cp\.async\.ca\.shared\.global",
    "TMA loads": r"cp\.async\.bulk\.tensor",
    "ld.global vector": r"ld\.global(?:\.\w+)*\.v[248]\.",
    "ld.global scalar": r"ld\.global(?:\.(?:nc|L1::\w+|L2::\w+|ca|cg|cs|lu|cv))*\.(?:b|u|s|f)(?:8|16|32|64)\b",
    "st.global vector": r"st\.global(?:\.\w+)*\.v[248]\.",
    "st.global scalar": r"st\.global(?:\.(?:L1::\w+|L2::\w+|wb|cg|cs|wt))*\.(?:b|u|s|f)(?:8|16|32|64)\b",
    "wgmma": r"wgmma\.mma_async",
    "mma.sync": r"\bmma\.sync",
}


@dataclass
class KernelCase:
    """A kernel and the arguments of one launch: `args` maps each runtime argument to (type,
    value); `value` decides the launcher's specialization (1 -> constant, % 16 == 0 ->
    divisible by 16); pointers are always 16-byte aligned here (torch allocations)."""

    name: str
    kernel: object
    args: dict
    constexprs: dict
    num_warps: int
    num_stages: int
    options: dict = field(default_factory=lambda: {"enable_fp_fusion": False})


def compile_sm90(case: KernelCase, stage: str = "ptx"):
    """The PTX (or another stage: "cubin", "ttgir", ...) of `case` compiled for sm_90."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig, consts, attrs = {}, dict(case.constexprs), {}
    params = list(case.kernel.arg_names)
    defaults = {p.name: p.default for p in case.kernel.params if p.is_constexpr and p.has_default}
    for i, name in enumerate(params):
        if name not in case.constexprs and name not in case.args and name in defaults:
            consts[name] = defaults[name]  # a constexpr the case leaves at its default
        if name in consts:
            sig[name] = "constexpr"
            continue
        kind, value = case.args[name]
        if kind.startswith("*"):
            sig[name] = kind
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif kind in ("i32", "i64") and value == 1:
            sig[name] = "constexpr"
            consts[name] = 1
        else:
            sig[name] = kind
            if kind in ("i32", "i64") and value % 16 == 0 and value != 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=case.kernel, signature=sig, constexprs=consts, attrs=attrs)
    options = {"num_warps": case.num_warps, "num_stages": case.num_stages, **case.options}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm[stage]


def sass_instructions(case: KernelCase) -> int:
    """How many SASS instructions the sm_90 cubin of `case` holds (nvdisasm bundled with
    Triton): for the loop-free quantize kernel, the work of one program, a proxy of its ALU
    cost (instructions per element = this / (BLOCK_M * BLOCK_K / threads))."""
    import subprocess
    import tempfile

    import triton

    nvdisasm = os.path.join(
        os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm"
    )
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compile_sm90(case, "cubin"))
        f.flush()
        text = subprocess.run(
            [nvdisasm, "-c", f.name], capture_output=True, text=True, check=True
        ).stdout
    return len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+\S", text, re.M))


def resource_usage(case: KernelCase) -> dict:
    """Registers per thread, stack (local memory) bytes per thread and spill stores (SASS `STL`)
    of the sm_90 cubin (cuobjdump / nvdisasm bundled with Triton). 255 registers with spill
    stores is a kernel that keeps too much live: the invariant attention held FP32 copies of
    q, k and v and, with a mask tensor, a [rows, keys] tensor of byte pointers (2026-12-04)."""
    import subprocess
    import tempfile

    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compile_sm90(case, "cubin"))
        f.flush()
        usage = subprocess.run(
            [os.path.join(tools, "cuobjdump"), "--dump-resource-usage", f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        sass = subprocess.run(
            [os.path.join(tools, "nvdisasm"), "-c", f.name],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    regs = re.search(r"REG:(\d+)", usage)
    stack = re.search(r"STACK:(\d+)", usage)
    return {
        "registers": int(regs.group(1)) if regs else -1,
        "stack bytes": int(stack.group(1)) if stack else -1,
        "spill stores": len(re.findall(r"\bSTL\b", sass)),
    }


def count(ptx: str) -> dict:
    return {k: len(re.findall(p, ptx)) for k, p in PATTERNS.items()}


def learner_cases() -> list[KernelCase]:
    """The learner's hot kernels at Qwen3-30B-A3B-shaped launches (4096 tokens, 8 of 128
    experts, hidden 2048, MoE intermediate 768), with their pinned configs."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("ptx_audit compiles for the GPU: run it without TRITON_INTERPRET")
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.nvfp4 import gemm_kernel as gemm
    from fp4_compile.codegen.nvfp4 import grouped_wgrad_kernel as gw

    t, n, k, e, c = 32768, 1536, 2048, 128, 34816
    wg = configs.pick("sm_90", "bf16", "nvfp4_wgrad", n)
    ongrid = configs.pick("sm_90", "bf16", "nvfp4_gemm_ongrid", t)
    i32, bf16, f32, i64 = "i32", "*bf16", "*fp32", "*i64"
    cases = [
        KernelCase(
            "MoE wgrad (grouped_wgrad)",
            gw._grouped_wgrad_kernel,
            {
                "a_ptr": (bf16, 0),
                "b_ptr": (bf16, 0),
                "gda_ptr": (f32, 0),
                "gdb_ptr": (f32, 0),
                "out_ptr": (bf16, 0),
                "start_ptr": (i64, 0),
                "width_ptr": (i64, 0),
                "N": (i32, n),
                "K": (i32, k),
                "stride_an": (i32, c),
                "stride_bk": (i32, c),
                "gda_e": (i32, 0),
                "gda_r": (i32, 0),
                "stride_oe": (i32, n * k),
                "stride_on": (i32, k),
            },
            {
                "DOT_F32": False,
                "BLOCK_M": wg.block_m,
                "BLOCK_N": wg.block_n,
                "BLOCK_K": wg.block_k,
                "SEGMENT_ALIGN": 16,
            },
            wg.num_warps,
            wg.num_stages,
        ),
    ]
    for label, (sbe, sbn, sbk), gather in (
        ("MoE forward, B on-grid [E, N, K], A rows gathered", (n * k, k, 1), True),
        ("MoE dgrad, B = W^T view of on-grid [E, N, K]", (n * k, 1, n), False),
    ):
        cases.append(
            KernelCase(
                f"{label} (nvfp4_gemm)",
                gemm._nvfp4_gemm_kernel,
                {
                    "a_ptr": (bf16, 0),
                    "b_ptr": (bf16, 0),
                    "bs_ptr": ("*u8", 0),
                    "gda_ptr": (f32, 0),
                    "gdb_ptr": (f32, 0),
                    "bias_ptr": (f32, 0),
                    "out_ptr": (bf16, 0),
                    "group_end_ptr": ("*i32", 0),
                    "a_rows_ptr": ("*i32", 0),
                    "M": (i32, t),
                    "N": (i32, n),
                    "K": (i32, k),
                    "E": (i32, e),
                    "stride_am": (i32, k),
                    "stride_ak": (i32, 1),
                    "stride_be": (i32, sbe),
                    "stride_bn": (i32, sbn),
                    "stride_bk": (i32, sbk),
                    "stride_se": (i32, 0),
                    "stride_sn": (i32, 0),
                    "gda_stride": (i32, 1),
                    "gdb_stride": (i32, 1),
                    "stride_om": (i32, n),
                    "stride_on": (i32, 1),
                },
                {
                    "GROUPED": True,
                    "B_PACKED": False,
                    "HAS_BIAS": False,
                    "DOT_F32": False,
                    "BLOCK_M": ongrid.block_m,
                    "BLOCK_N": ongrid.block_n,
                    "BLOCK_K": ongrid.block_k,
                    "BLOCK_E": e,
                    "A_GATHER": gather,
                    "GDA_SHARED": False,
                },
                ongrid.num_warps,
                ongrid.num_stages,
            )
        )
    dense = configs.pick("sm_90", "bf16", "nvfp4_wgrad", 2048)
    cases.append(
        KernelCase(
            "dense wgrad [2048, 4096] x [2048, 4096]^T (nvfp4_gemm)",
            gemm._nvfp4_gemm_kernel,
            {
                "a_ptr": (bf16, 0),
                "b_ptr": (bf16, 0),
                "bs_ptr": ("*u8", 0),
                "gda_ptr": (f32, 0),
                "gdb_ptr": (f32, 0),
                "bias_ptr": (f32, 0),
                "out_ptr": (bf16, 0),
                "group_end_ptr": ("*i32", 0),
                "a_rows_ptr": ("*i32", 0),
                "M": (i32, 2048),
                "N": (i32, 2048),
                "K": (i32, 4096),
                "E": (i32, 1),
                "stride_am": (i32, 4096),
                "stride_ak": (i32, 1),
                "stride_be": (i32, 0),
                "stride_bn": (i32, 4096),
                "stride_bk": (i32, 1),
                "stride_se": (i32, 0),
                "stride_sn": (i32, 0),
                "gda_stride": (i32, 0),
                "gdb_stride": (i32, 0),
                "stride_om": (i32, 2048),
                "stride_on": (i32, 1),
            },
            {
                "GROUPED": False,
                "B_PACKED": False,
                "HAS_BIAS": False,
                "DOT_F32": False,
                "BLOCK_M": dense.block_m,
                "BLOCK_N": dense.block_n,
                "BLOCK_K": dense.block_k,
                "BLOCK_E": 2,
                "A_GATHER": False,
                "GDA_SHARED": True,
            },
            dense.num_warps,
            dense.num_stages,
        )
    )
    cases += _attention_cases() + _quantize_cases() + _layout_cases() + _row_scale_cases()
    return cases + _fused_producer_cases()


def _fused_producer_cases() -> list[KernelCase]:
    """The producers that emit their GEMM's operand (`passes/fuse_quantize_into_producers.py`):
    RMSNorm over [4096, 2048] (compiled with the norm's options: FP contraction on) and the
    experts' SwiGLU over the halves of [32768, 1536], each with its per-row on-grid quantize."""
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.invariant.rms_norm_kernel import rms_norm_launch
    from fp4_compile.codegen.nvfp4 import rms_norm_quantize_kernel as rq
    from fp4_compile.codegen.nvfp4 import silu_mul_quantize_kernel as sq

    block, rows, warps = rms_norm_launch(2048)
    silu = configs.pick_launch("sm_90", "silu_mul_quantize")
    block_r, block_c, block_k = silu["block_r"], silu["block_c"], silu["block_k"]
    silu_warps = silu["num_warps"]
    return [
        KernelCase(
            "rms_norm_quantize [4096, 2048]",
            rq._rms_norm_quantize_kernel,
            {
                "x_ptr": ("*bf16", 0),
                "w_ptr": ("*bf16", 0),
                "y_ptr": ("*bf16", 0),
                "ongrid_ptr": ("*bf16", 0),
                "gd_ptr": ("*fp32", 0),
                "amax_ptr": ("*fp32", 0),
                "r_ptr": ("*bf16", 0),  # no residual: x's pointer (rms_norm_quantize._launch)
                "h_ptr": ("*bf16", 0),
                "R": ("i32", 4096),
                "H": ("i32", 2048),
                "eps": ("fp32", 1e-6),
                "one_sixth": ("fp32", 1.0 / 6.0),
            },
            {"HAS_RES": False, "HAS_W": True, "BLOCK_H": block, "ROWS": rows},
            warps,
            1,
            options={},
        ),
        KernelCase(
            "silu_mul_quantize halves of [32768, 1536]",
            sq._silu_mul_quantize_kernel,
            {
                "a_ptr": ("*bf16", 0),
                "b_ptr": ("*bf16", 0),
                "o_ptr": ("*bf16", 0),
                "ongrid_ptr": ("*bf16", 0),
                "gd_ptr": ("*fp32", 0),
                "amax_ptr": ("*fp32", 0),
                "m_ptr": ("*u8", 0),
                "R": ("i32", 32768),
                "C": ("i32", 768),
                "sa": ("i32", 1536),
                "sb": ("i32", 1536),
                "one_sixth": ("fp32", 1.0 / 6.0),
            },
            {
                "BF16": True,
                "INTERP": False,
                "ROW_MASK": False,
                "BLOCK_R": block_r,
                "BLOCK_C": block_c,
                "BLOCK_K": block_k,
            },
            silu_warps,
            1,
        ),
    ]


def _row_scale_cases() -> list[KernelCase]:
    """row_scale's backward at the top-k combine (8 x 4096 rows of 2048, grad rows through the
    inverse permutation), at the pinned launch and at 4 blocks of 64 columns per loop step."""
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.moe import row_scale_kernel as rk

    args = {
        "g_ptr": ("*bf16", 0),
        "x_ptr": ("*bf16", 0),
        "w_ptr": ("*fp32", 0),
        "gx_ptr": ("*bf16", 0),
        "gw_ptr": ("*fp32", 0),
        "m_ptr": ("*u8", 0),
        "gi_ptr": ("*i64", 0),
        "R": ("i32", 32768),
        "H": ("i32", 2048),
        "row_div": ("i32", 8),
    }
    cases = []
    pinned = configs.pick_launch("sm_90", "row_scale_backward")
    for block_r, warps, most in {
        (pinned["block_r"], pinned["num_warps"], pinned["most_blocks"]),
        (16, 4, 4),
    }:
        nb = rk.blocks_per_step(2048, most)
        flags = {"BLOCK_R": block_r, "BLOCK": 64, "NB": nb, "ROW_MASK": False, "G_GATHER": True}
        cases.append(
            KernelCase(
                f"row_scale backward ({block_r} rows, {warps} warps, {nb} blocks per step)",
                rk._row_scale_backward_kernel,
                args,
                flags,
                warps,
                1,
            )
        )
    return cases


def _layout_cases() -> list[KernelCase]:
    """The MoE wgrad's padded layout (`codegen/nvfp4/segment_layout_kernel.py`), 128 experts, 32768
    tokens, with the gather index (gate_up's X^T) as the learner launches it: its tiles must not
    spill (an int64 [64, 128] version did: 0.11 ms per call)."""
    from fp4_compile.codegen.nvfp4 import segment_layout_kernel as sl

    i64, i32 = "*i64", "*i32"
    return [
        KernelCase(
            "segment layout: 128 experts, 34688 columns, gather index",
            sl._segment_layout_kernel,
            {
                "ends_ptr": (i32, 0),
                "src_ptr": (i64, 0),
                "group_ptr": (i32, 0),
                "start_ptr": (i64, 0),
                "width_ptr": (i64, 0),
                "row_index_ptr": (i64, 0),
                "src_rows_ptr": (i64, 0),
                "E": ("i32", 128),
                "C": ("i32", 34688),
            },
            {"BLOCK_C": 16, "BLOCK_E": 128, "ROW_INDEX": True},
            4,
            3,
        )
    ]


def _quantize_cases() -> list[KernelCase]:
    """The quantize kernel's learner launches: an activation (1x16, per-row, RNE, on-grid out),
    a gradient (1x16, per tensor, SR with a device-held seed), a weight (16x16, on-grid only:
    the learner's GEMMs read nothing else), and the wgrad's transposing segmented quantize (SR)."""
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.nvfp4 import codes_kernel as qk

    q = configs.pick("sm_90", "any", "nvfp4_quantize", 4096)
    qs = configs.pick("sm_90", "any", "nvfp4_quantize_segments", 2048)
    i32, f32 = "i32", "*fp32"

    def case(label, cfg, r, k, stride_xr, stride_xc, flags):
        args = {
            "x_ptr": ("*bf16", 0),
            "mult_ptr": (f32, 0),
            "gd_ptr": (f32, 0),
            "codes_ptr": ("*u8", 0),
            "scales_ptr": ("*u8", 0),
            "ongrid_ptr": ("*bf16", 0),
            "R": (i32, r),
            "K": (i32, k),
            "stride_xr": (i32, stride_xr),
            "mult_stride": (i32, 0),
            "gd_stride": (i32, 0),
            "sr_seed": ("i64", 2**40 + 12345),
            "seed_ptr": ("*i64", 0),
            "seed_offset": (i32, 1),
            "group_ptr": ("*i32", 0),
            "seg_start_ptr": ("*i64", 0),
            "seg_width_ptr": ("*i64", 0),
            "group_stride": (i32, 0),
            "src_ptr": ("*i64", 0),
            "stride_xc": (i32, stride_xc),
            "n_tok": (i32, 0),
        }
        flags = {
            "TILE16": False,
            "STOCHASTIC": False,
            "ONGRID": True,
            "SEGMENTED": False,
            "SEED_FROM_PTR": False,
            "PACKED_TOO": False,
            "ONE_SEGMENT": False,
            "FLAT32": False,
            "BLOCK_M": cfg.block_m,
            "BLOCK_K": cfg.block_k,
            **flags,
        }
        return KernelCase(
            f"quantize: {label}", qk._quantize_kernel, args, flags, cfg.num_warps, cfg.num_stages
        )

    return [
        case("activation [32768, 2048] per-row RNE on-grid", q, 32768, 2048, 2048, 0, {}),
        case(
            "gradient [32768, 2048] per-tensor SR on-grid",
            q,
            32768,
            2048,
            2048,
            0,
            {"STOCHASTIC": True, "SEED_FROM_PTR": True, "FLAT32": True},
        ),
        case("weight [196608, 2048] 16x16 on-grid", q, 196608, 2048, 2048, 0, {"TILE16": True}),
        case(
            "wgrad dY^T segments [1536, 34816] SR",
            qs,
            1536,
            34816,
            1,
            1536,
            {"STOCHASTIC": True, "SEGMENTED": True, "FLAT32": True},
        ),
    ]


def _attention_cases() -> list[KernelCase]:
    """The invariant attention's forward and its two backward launches, 512 queries, 32 query
    / 4 key-value heads, head dim 128, q, k and v as the projections hand them (transposes of
    [B, T, H, D], read in place), O, dQ, dK and dV contiguous, int64 positions: causal
    (is_causal), and with a mask tensor (what transformers hands the learner under
    torch.compile: `mask_args`' row intervals and bit words)."""
    import triton.language as tl

    from fp4_compile.codegen import configs as cfgs
    from fp4_compile.codegen.invariant import attention_dkdv_kernel as dkdv
    from fp4_compile.codegen.invariant import attention_dq_kernel as dq
    from fp4_compile.codegen.invariant import attention_kernel as ik

    hq, hkv, t, d = 32, 4, 512, 128  # batch 8: only the strides below see it
    i32, bf16 = "i32", "*bf16"
    strides = {
        "sqb": (i32, t * hq * d),
        "sqh": (i32, d),
        "sqt": (i32, hq * d),
        "skb": (i32, t * hkv * d),
        "skh": (i32, d),
        "skt": (i32, hkv * d),
    }
    no_mask = {"smb": (i32, 0), "smh": (i32, 0), "smt": (i32, 0)}
    unpaged = {"bt_ptr": ("*i64", 0), "sbt": (i32, 0), "spage": (i32, 0)}
    mask = {"smb": (i32, t), "smh": (i32, 0), "smt": (i32, t // 32)}  # rows per sequence, words
    common = {
        "qs_ptr": ("*i64", 0),
        "kl_ptr": ("*i64", 0),
        "m_ptr": ("*i32", 0),
        "iv_ptr": ("*i32", 0),
        "ivf_ptr": ("*i32", 0),
        "lse_ptr": ("*fp32", 0),
        "part_ptr": ("*fp32", 0),  # the forward's decode parts (lse's, unread, without them)
        "Tq": (i32, t),
        "G": (i32, hq // hkv),
        "scale": ("fp32", 0.0),
        **strides,
    }
    fwd = cfgs.pick("sm_90", "any", "invariant_attention", 0)
    dq_cfg = cfgs.pick("sm_90", "any", "invariant_attention_dq", 0)
    dkdv_cfg = cfgs.pick("sm_90", "any", "invariant_attention_dkdv", 0)
    tensors = {
        n: (bf16, 0)
        for n in ("q_ptr", "k_ptr", "v_ptr", "o_ptr", "do_ptr", "dq_ptr", "dk_ptr", "dv_ptr")
    }
    out_strides = {"sob": (i32, hq * t * d), "soh": (i32, t * d), "sot": (i32, d)}
    # the backward runs per query head (G = 1), reading KV head h // 8 in place (KV_REP = 8),
    # dK / dV per query head (summed per group after)
    grad_strides = {
        "sgb": (i32, hq * t * d),
        "sgh": (i32, t * d),
        "sgt": (i32, d),
        "sekb": (i32, hq * t * d),
        "sekh": (i32, t * d),
        "sekt": (i32, d),
        "G": (i32, 1),
        "KV_REP": (i32, hq // hkv),
    }
    # dO as autograd hands it: the transpose of [B, Tq, Hq, D]
    do_strides = {"sdb": (i32, t * hq * d), "sdh": (i32, d), "sdt": (i32, hq * d)}
    cases = []
    for label, flags, sm in (
        ("", {"CAUSAL": True, "HAS_MASK": False}, no_mask),
        (", mask tensor", {"CAUSAL": False, "HAS_MASK": True}, mask),
    ):
        flags = {**flags, "DOT": tl.bfloat16, "D": d}
        cases += [
            KernelCase(
                f"attention forward (invariant){label}",
                ik._attention_kernel,
                # not paged: the block table's pointer is kv_len's, its strides 0 (attention.py)
                {**tensors, **common, **sm, **out_strides, **unpaged},
                {
                    **flags,
                    "BLOCK_M": fwd.block_m,
                    "BLOCK_N": fwd.block_n,
                    "PAGED": False,
                    "PAGE": fwd.block_n,
                },
                fwd.num_warps,
                fwd.num_stages,
                {},
            ),  # launched with Triton's defaults
            KernelCase(
                f"attention backward dQ{label}",
                dq._dq_kernel,
                {
                    **tensors,
                    **common,
                    **sm,
                    **do_strides,
                    **out_strides,
                    **grad_strides,
                    "delta_ptr": ("*fp32", 0),
                },
                {**flags, "BLOCK_M": dq_cfg.block_m, "BLOCK_N": dq_cfg.block_n},
                dq_cfg.num_warps,
                dq_cfg.num_stages,
                {},
            ),
            KernelCase(
                f"attention backward dK/dV{label}",
                dkdv._dkdv_kernel,
                {
                    **tensors,
                    **common,
                    **sm,
                    **do_strides,
                    **out_strides,
                    **grad_strides,
                    "delta_ptr": ("*fp32", 0),
                    "Tk": (i32, t),
                },
                {**flags, "BLOCK_M": dkdv_cfg.block_m, "BLOCK_N": dkdv_cfg.block_n},
                dkdv_cfg.num_warps,
                dkdv_cfg.num_stages,
                {},
            ),
        ]
    return cases


def main() -> None:
    import json
    import sys

    import triton

    if "--json" in sys.argv[1:]:
        print(
            json.dumps(
                {c.name: {**count(compile_sm90(c)), **resource_usage(c)} for c in learner_cases()}
            )
        )
        return
    print(
        f"# PTX audit: sm_90 code of the learner's hot kernels, compiled without a GPU "
        f"(Triton {triton.__version__})\n"
    )
    print(
        "| kernel | " + " | ".join(PATTERNS) + " | SASS instructions (per element) "
        "| registers | stack bytes | spill stores |"
    )
    print("| --- |" + " --- |" * (len(PATTERNS) + 4))
    for case in learner_cases():
        try:
            row = count(compile_sm90(case))
            sass = sass_instructions(case)
            per = ""
            if case.name.startswith("quantize"):
                threads = 32 * case.num_warps
                per = f" ({sass * threads / (case.constexprs['BLOCK_M'] * case.constexprs['BLOCK_K']):.1f})"
            use = resource_usage(case)
            print(
                f"| {case.name} | "
                + " | ".join(str(row[k]) for k in PATTERNS)
                + f" | {sass}{per} | "
                + " | ".join(str(v) for v in use.values())
                + " |"
            )
        except Exception as exc:  # recorded, not hidden
            print(f"| {case.name} | ERROR: {type(exc).__name__}: {str(exc)[:200]} |")


if __name__ == "__main__":
    main()
