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
    "wgmma syncs (WARPGROUP.ARRIVE / DEPBAR)": r"^WARPGROUP",
}


def _sass(case: KernelCase) -> str:
    import triton

    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compile_sm90(case, "cubin"))
        f.flush()
        return subprocess.run(
            [tool, "-c", f.name], capture_output=True, text=True, check=True
        ).stdout


def spills(sass: str) -> int:
    """Local-memory loads and stores in the whole kernel (register spills)."""
    return len(re.findall(r"\b(STL|LDL)\b", sass))


def loop_mix(sass: str) -> collections.Counter:
    """Opcode classes of the instructions in the largest backward-branch range (the K loop);
    "hot path": its instructions less those a forward branch inside the loop skips (the K
    chunk's end block, run once per chunk)."""
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
    skipped = set()
    for addr, op, rest in ins:
        tgt = re.search(r"(\.L_x_\d+)", rest) if op.startswith("BRA") else None
        if tgt and best[0] <= addr < labels.get(tgt.group(1), 0) <= best[1]:
            skipped |= {a for a, _, _ in ins if addr < a < labels[tgt.group(1)]}
    mix = collections.Counter()
    for addr, op, _ in ins:
        if best[0] <= addr <= best[1]:
            mix["hot path"] += addr not in skipped
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
    kc = configs.k_chunk("sm_90", "nvfp4_gemm") or 1024  # the chunk measured where sm_90 pins 0

    def learner(label, cfg, rows, packed, k_chunk):
        words = packed and cfg.block_k % 64 == 0
        return (
            KernelCase(
                f"{label} {cfg.block_m}x{cfg.block_n}x{cfg.block_k}, K_CHUNK={k_chunk}",
                gk._nvfp4_gemm_kernel,
                {
                    "a_ptr": (bf16, 0),
                    "b_ptr": ("*u8" if packed else bf16, 0),
                    "bs_ptr": ("*i32" if words else "*u8", 0),
                    "gda_ptr": (f32, 0),
                    "gdb_ptr": (f32, 0),
                    "bias_ptr": (f32, 0),
                    "out_ptr": (bf16, 0),
                    "group_end_ptr": ("*i32", 0),
                    "a_rows_ptr": ("*i32", 0),
                    "M": (i32, rows),
                    "N": (i32, n),
                    "K": (i32, k),
                    "E": (i32, 1),
                    "stride_am": (i32, k),
                    "stride_ak": (i32, 1),
                    "stride_be": (i32, 0),
                    "stride_bn": (i32, k // 2 if packed else k),
                    "stride_bk": (i32, 1),
                    "stride_se": (i32, 0),
                    "stride_sn": (i32, k // (64 if words else 16)),
                    "gda_stride": (i32, 1),
                    "gdb_stride": (i32, 0),
                    "stride_om": (i32, n),
                    "stride_on": (i32, 1),
                },
                {
                    "GROUPED": False,
                    "B_PACKED": packed,
                    "HAS_BIAS": False,
                    "DOT_F32": False,
                    "BLOCK_M": cfg.block_m,
                    "BLOCK_N": cfg.block_n,
                    "BLOCK_K": cfg.block_k,
                    "BLOCK_E": 2,
                    "A_GATHER": False,
                    "GDA_SHARED": False,
                    "SCALE_WORDS": words,
                    "K_CHUNK": k_chunk,
                },
                cfg.num_warps,
                cfg.num_stages,
            ),
            cfg.block_n * cfg.block_k,
        )

    old = configs.pick("sm_90", "bf16", "nvfp4_gemm", m)
    wide = configs.pick("sm_90", "bf16", "nvfp4_gemm_ongrid", 4096)
    big = configs.TileConfig(128, 128, 64, num_warps=8, num_stages=4)
    out = [
        learner("learner packed kernel, decode bucket", old, m, True, 0),
        learner("learner packed kernel, decode bucket", old, m, True, kc),
        learner("learner on-grid forward, 4096 rows", big, 4096, False, 0),
        learner("learner on-grid forward, 4096 rows", big, 4096, False, kc),
        learner("learner on-grid forward (the one-chain pin)", wide, 4096, False, 0),
        learner("learner on-grid forward (the one-chain pin)", wide, 4096, False, kc),
    ]
    variants = []
    for mx, c in configs.DECODE["sm_90"]:
        variants += [
            (f"decode kernel, pinned M<={mx}, K_CHUNK=0", c, 0, 1),
            (f"decode kernel, pinned M<={mx}, K_CHUNK={kc}", c, kc, 1),
            (f"decode kernel, pinned M<={mx}, K_CHUNK={kc}, split 4", c, kc, 4),
            (f"decode kernel, A quantized in its prologue, pinned M<={mx}, K_CHUNK=0", c, 0, -1),
        ]
    for w in (64, 32, 16):
        variants.append(
            (
                f"decode kernel, learner orientation, {w} weight rows (sweep candidate)",
                configs.DecodeConfig(64, w, 128, num_stages=3, weights_right=True),
                kc,
                1,
            )
        )
    row_codes = configs.pick_launch("sm_90", "row_codes")
    for label, c, k_chunk, split in variants:  # split -1: one program per output, A_PARTS
        out.append(
            (
                KernelCase(
                    f"{label}: {c.block_t}x{c.block_w}x{c.block_k}, {c.num_warps} warps",
                    dk._nvfp4_decode_gemm_kernel,
                    {
                        "a_ptr": (bf16, 0),
                        "b_ptr": ("*i32", 0),
                        "bs_ptr": ("*i32" if c.block_k % 64 == 0 else "*u8", 0),
                        "gda_ptr": (f32, 0),
                        "gdb_ptr": (f32, 0),
                        "bias_ptr": (f32, 0),
                        "out_ptr": (bf16, 0),
                        "group_end_ptr": ("*i32", 0),
                        "a_rows_ptr": ("*i32", 0),
                        "M": (i32, m),
                        "N": (i32, n),
                        "K": (i32, k),
                        "E": (i32, 1),
                        "stride_am": (i32, k),
                        "stride_ak": (i32, 1),
                        "stride_be": (i32, 0),
                        "stride_bn": (i32, k // 8),
                        "stride_se": (i32, 0),
                        "stride_sn": (i32, k // (64 if c.block_k % 64 == 0 else 16)),
                        "gda_stride": (i32, 1),
                        "gdb_stride": (i32, 0),
                        "stride_om": (i32, n),
                        "stride_on": (i32, 1),
                        "part_ptr": (f32, 0),
                        "stride_pc": (i32, m * n),
                        "chunks_per_split": (i32, 2),
                        "a_part_ptr": (f32, 0),
                        "P": (i32, k // 256),
                        "gd_out_ptr": (f32, 0),
                        "one_sixth": ("fp32", 1.0 / 6.0),
                    },
                    {
                        "GROUPED": False,
                        "HAS_BIAS": False,
                        "WORDS": True,
                        "BLOCK_T": c.block_t,
                        "BLOCK_W": c.block_w,
                        "BLOCK_K": c.block_k,
                        "BLOCK_E": 2,
                        "A_GATHER": False,
                        "GDA_SHARED": False,
                        "SCALE_WORDS": c.block_k % 64 == 0,
                        "WEIGHTS_RIGHT": c.weights_right,
                        "EVEN_K": True,
                        "K_CHUNK": k_chunk,
                        "SPLIT": max(split, 1),
                        "A_PARTS": split < 0,
                        "BLOCK_P": row_codes["block_p"],
                    },
                    c.num_warps,
                    c.num_stages,
                ),
                c.block_w * c.block_k,
            )
        )
    return out


def main() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("decode_sass_audit compiles for the GPU: run it without TRITON_INTERPRET")
    import triton

    env = environment()
    cols = [*CLASSES, "other", "total"]
    extra = ["hot path", "spills (STL / LDL in the kernel)"]
    lines = [
        f"# Decode GEMM main loop, sm_90 SASS compiled without a GPU (Triton "
        f"{triton.__version__}; the H200 runs 3.6), commit {env['commit']}",
        "",
        "Warp instructions per 32 weights in the K loop (M = 16 launch, N = K = 8192; the "
        "learner's on-grid forward: M = 4096). K_CHUNK: the K summation order's chunk "
        "(configs.K_CHUNK; 0 = one chain); a chunk-end add sits behind a branch inside the "
        "loop, so the loop's instructions include it once per iteration's code, executed "
        "once per chunk.",
        "",
        "| kernel | " + " | ".join(cols + extra) + " |",
        "| --- |" + " --- |" * (len(cols) + 2),
    ]
    payload = {"env": env, "rows": {}}
    for case, weights in cases():
        sass = _sass(case)
        mix = loop_mix(sass)
        scale = case.num_warps / (weights / 32)
        per = {c: round(mix.get(c, 0) * scale, 2) for c in [*cols, "hot path"]}
        payload["rows"][case.name] = {
            "per_32_weights": per,
            "loop_instructions": dict(mix),
            "spills": spills(sass),
        }
        lines.append(
            f"| {case.name} | "
            + " | ".join(f"{per[c]:g}" for c in cols)
            + f" | {per['hot path']:g} | {spills(sass)} |"
        )
        print(lines[-1], flush=True)
    write_results("decode_sass_audit_cpu", payload, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
