"""A cost model's rows summed: a step's totals, the rows per op, the roofline constants and the
result files that measured them."""

from __future__ import annotations

from .rules import BF16_FLOPS_PER_S, COPY_BYTES_PER_S, OpCost


def summarize(rows: list[OpCost]) -> dict:
    """A step's totals (launches, bytes, FLOPs, roofline) over its rows."""
    return {
        "launches": sum(r.launches for r in rows),
        "launches_eager": sum(
            len(r.nodes) if r.op.startswith("fused") else r.launches for r in rows
        ),
        "bytes": sum(r.bytes for r in rows),
        "bytes_read": sum(r.bytes_read for r in rows),
        "bytes_written": sum(r.bytes_written for r in rows),
        "flops": sum(r.flops for r in rows),
        "roofline_ms": sum(r.roofline_us for r in rows) / 1e3,
        "kv_cache_copy_bytes": sum(r.bytes for r in rows if r.copies_kv_cache),
    }


def by_op(rows: list[OpCost]) -> list[dict]:
    """Rows summed per op name, most bytes first."""
    agg: dict[str, dict] = {}
    for r in rows:
        a = agg.setdefault(
            r.op,
            {
                "op": r.op,
                "count": 0,
                "launches": 0,
                "bytes": 0,
                "flops": 0,
                "roofline_us": 0.0,
                "kv_cache": r.kv_cache,
            },
        )
        a["count"] += 1
        a["launches"] += r.launches
        a["bytes"] += r.bytes
        a["flops"] += r.flops
        a["roofline_us"] += r.roofline_us
    return sorted(agg.values(), key=lambda a: -a["bytes"])


def constants() -> dict:
    return {
        "copy_bytes_per_s": COPY_BYTES_PER_S,
        "copy_source": "benchmarks/results/2026-12-05_decode_gemm_20848a7.md",
        "bf16_flops_per_s": BF16_FLOPS_PER_S,
        "bf16_source": "benchmarks/results/2026-12-02_gemm.md",
    }
