"""The decode GEMM's main loop on sm_90, without a GPU: the instruction mix per 32 weights of the
packed-weight kernels, compiled for an H200 target on this machine (`tools.ptx_audit`'s
compiler path, nvdisasm bundled with Triton).

The K loop is the SASS range between the last backward branch and its target; its instructions
are counted by class and scaled to warp instructions per 32 weights (a warp instruction does 32
lanes' work): loop instructions x warps / (BLOCK_W x BLOCK_K / 32). Compared: the learner's
packed kernel at its decode bucket (`gemm_kernel`, 64 x 64 x 64, dequantizing E2M1 x E4M3 by
arithmetic and broadcasting the scales), and the decode kernel at its pinned buckets and
variants. A proxy of ALU cost that ranks variants of one data flow; the GPU decides speed.

    python -m tools.decode_sass_audit      (no TRITON_INTERPRET; writes benchmarks/results)
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile

from benchmarks.common import environment, write_results
from tools.ptx_audit import KernelCase, compile_sm90

CLASSES = {
    "HGMMA / HMMA (tensor core)": r"^(HGMMA|HMMA)",
    "LDG / LDGSTS (global loads)": r"^(LDG|LDGSTS|UTMALDG)",
    "LDS / STS / LDSM (shared memory)": r"^(LDS|STS|LDSM)",
    "integer (LOP3, SHF, IADD3, PRMT, IMAD, ...)": r"^(LOP3|SHF|IADD3|PRMT|IMAD|ISETP|SEL|LEA|IABS|IMNMX|SGXT|BMSK)",
    "FP32 (FMUL, FADD, FFMA, FSEL, FSETP)": r"^(FMUL|FADD|FFMA|FSEL|FSETP|FMNMX)",
    "packed half (HMUL2, HFMA2, HADD2)": r"^(HMUL2|HFMA2|HADD2)",
    "conversions (F2F, I2F, F2I, F2FP)": r"^(F2F|I2F|F2I|F2FP|I2FP)",
    "moves / shuffles (MOV, SHFL)": r"^(MOV|SHFL|UMOV)",
    "block barriers (BAR)": r"^BAR\b",
}


def _sass(case: KernelCase) -> str:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compile_sm90(case, "cubin"))
        f.flush()
        return subprocess.run([tool, "-c", f.name], capture_output=True, text=True,
                              check=True).stdout  # fmt: skip


def loop_mix(sass: str) -> collections.Counter:
    """Opcode classes of the instructions in the largest backward-branch range (the K loop)."""
    ins = []  # (address, opcode, text)
    for m in re.finditer(
        r"^\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][\w.]*)([^;]*);", sass, re.M
    ):
        ins.append((int(m.group(1), 16), m.group(2), m.group(3)))
    labels = {}
    for m in re.finditer(r"^(\.L_x_\d+):", sass, re.M):
        nxt = re.search(r"/\*([0-9a-f]{4,})\*/", sass[m.end() :])
        if nxt:
            labels[m.group(1)] = int(nxt.group(1), 16)
    best = (0, 0)
    for addr, op, rest in ins:
        if op.startswith("BRA"):
            tgt = re.search(r"(\.L_x_\d+)", rest)
            if tgt and labels.get(tgt.group(1), addr) < addr:
                start = labels[tgt.group(1)]
                if addr - start > best[1] - best[0]:
                    best = (start, addr)
    mix = collections.Counter()
    for addr, op, _ in ins:
        if best[0] <= addr <= best[1]:
            name = next((c for c, p in CLASSES.items() if re.match(p, op)), "other")
            mix[name] += 1
            mix["total"] += 1
    return mix


def cases() -> list[tuple[KernelCase, int]]:
    """(case, weights per loop iteration)."""
    from fp4_compile.codegen import configs
    from fp4_compile.codegen.nvfp4 import decode_gemm_kernel as dk
    from fp4_compile.codegen.nvfp4 import gemm_kernel as gk

    n, k, m = 8192, 8192, 16
    i32, bf16, f32 = "i32", "*bf16", "*fp32"
    old = configs.pick("sm_90", "bf16", "nvfp4_gemm", m)
    out = [(KernelCase(
        f"learner packed kernel, decode bucket {old.block_m}x{old.block_n}x{old.block_k}",
        gk._nvfp4_gemm_kernel,
        {"a_ptr": (bf16, 0), "b_ptr": ("*u8", 0),
         "bs_ptr": ("*i32" if old.block_k % 64 == 0 else "*u8", 0), "gda_ptr": (f32, 0),
         "gdb_ptr": (f32, 0), "bias_ptr": (f32, 0), "out_ptr": (bf16, 0),
         "group_end_ptr": ("*i32", 0), "a_rows_ptr": ("*i32", 0), "M": (i32, m), "N": (i32, n),
         "K": (i32, k), "E": (i32, 1), "stride_am": (i32, k), "stride_ak": (i32, 1),
         "stride_be": (i32, 0), "stride_bn": (i32, k // 2), "stride_bk": (i32, 1),
         "stride_se": (i32, 0), "stride_sn": (i32, k // (64 if old.block_k % 64 == 0 else 16)),
         "gda_stride": (i32, 1), "gdb_stride": (i32, 0), "stride_om": (i32, n),
         "stride_on": (i32, 1)},
        {"GROUPED": False, "B_PACKED": True, "HAS_BIAS": False, "DOT_F32": False,
         "BLOCK_M": old.block_m, "BLOCK_N": old.block_n, "BLOCK_K": old.block_k, "BLOCK_E": 2,
         "A_GATHER": False, "GDA_SHARED": False, "SCALE_WORDS": old.block_k % 64 == 0},
        old.num_warps, old.num_stages), old.block_n * old.block_k)]  # fmt: skip
    variants = [(f"decode kernel, pinned M<={mx}", c) for mx, c in configs.DECODE["sm_90"]]
    for w in (64, 32, 16):
        variants.append((f"decode kernel, learner orientation, {w} weight rows (sweep candidate)",
                         configs.DecodeConfig(64, w, 128, num_stages=3, weights_right=True)))  # fmt: skip
    for label, c in variants:
        out.append((KernelCase(
            f"{label}: {c.block_t}x{c.block_w}x{c.block_k}, {c.num_warps} warps",
            dk._nvfp4_decode_gemm_kernel,
            {"a_ptr": (bf16, 0), "b_ptr": ("*i32", 0),
             "bs_ptr": ("*i32" if c.block_k % 64 == 0 else "*u8", 0),
             "gda_ptr": (f32, 0), "gdb_ptr": (f32, 0), "bias_ptr": (f32, 0), "out_ptr": (bf16, 0),
             "group_end_ptr": ("*i32", 0), "a_rows_ptr": ("*i32", 0), "M": (i32, m),
             "N": (i32, n), "K": (i32, k), "E": (i32, 1), "stride_am": (i32, k),
             "stride_ak": (i32, 1), "stride_be": (i32, 0),
             "stride_bn": (i32, k // 8),
             "stride_se": (i32, 0), "stride_sn": (i32, k // (64 if c.block_k % 64 == 0 else 16)),
             "gda_stride": (i32, 1), "gdb_stride": (i32, 0), "stride_om": (i32, n),
             "stride_on": (i32, 1)},
            {"GROUPED": False, "HAS_BIAS": False, "WORDS": True, "BLOCK_T": c.block_t,
             "BLOCK_W": c.block_w, "BLOCK_K": c.block_k, "BLOCK_E": 2, "A_GATHER": False,
             "GDA_SHARED": False, "SCALE_WORDS": c.block_k % 64 == 0,
             "WEIGHTS_RIGHT": c.weights_right,
             "EVEN_K": True},
            c.num_warps, c.num_stages), c.block_w * c.block_k))  # fmt: skip
    return out


def main() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("decode_sass_audit compiles for the GPU: run it without TRITON_INTERPRET")
    import triton

    env = environment()
    cols = [*CLASSES, "other", "total"]
    lines = [f"# Decode GEMM main loop, sm_90 SASS compiled without a GPU (Triton "
             f"{triton.__version__}; the H200 runs 3.6), commit {env['commit']}", "",
             "Warp instructions per 32 weights in the K loop (M = 16 launch, N = K = 8192).", "",
             "| kernel | " + " | ".join(cols) + " |", "| --- |" + " --- |" * len(cols)]  # fmt: skip
    payload = {"env": env, "rows": {}}
    for case, weights in cases():
        mix = loop_mix(_sass(case))
        scale = case.num_warps / (weights / 32)
        per = {c: round(mix.get(c, 0) * scale, 2) for c in cols}
        payload["rows"][case.name] = {"per_32_weights": per, "loop_instructions": dict(mix)}
        lines.append(f"| {case.name} | " + " | ".join(f"{per[c]:g}" for c in cols) + " |")
        print(lines[-1], flush=True)
    write_results("decode_sass_audit_cpu", payload, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
