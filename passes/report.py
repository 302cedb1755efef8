"""The lowering report: what every matmul (and every other lowered op) became, and why."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GemmDecision:
    """One GEMM site of the graph."""

    module: str
    """Module path the GEMM was traced from (e.g. model.layers.0.self_attn.q_proj)."""
    kind: str
    """"linear" or "grouped_mm" (MoE experts)."""
    shape: str
    """[N, K] of the weight (or [E, N, K])."""
    precision: str = "nvfp4"
    """"nvfp4" or "bf16" (decided by select_gemms)."""
    reason: str = ""
    """Why it is BF16 (recipe, pattern, layer index, shape), or empty."""
    lowered_to: str = ""
    """The op the GEMM became; empty if it was not lowered (verify then fails)."""


@dataclass
class LoweringReport:
    recipe_fingerprint: str
    gemms: list[GemmDecision] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    census: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def count(self, what: str, n: int = 1) -> None:
        self.counts[what] = self.counts.get(what, 0) + n

    def merge(self, other: LoweringReport) -> None:
        self.gemms.extend(other.gemms)
        for k, v in other.counts.items():
            self.count(k, v)
        self.census.extend(other.census)
        self.notes.extend(other.notes)

    def table(self) -> str:
        rows = [("module", "kind", "weight", "precision", "lowered to", "why")]
        for g in self.gemms:
            rows.append(
                (
                    g.module or "<root>",
                    g.kind,
                    g.shape,
                    g.precision,
                    g.lowered_to or "NOT LOWERED",
                    g.reason,
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        other = ", ".join(f"{k}: {v}" for k, v in sorted(self.counts.items()))
        lines.append(f"lowered ops: {other}" if other else "lowered ops: none")
        lines.extend(f"note: {n}" for n in self.notes)
        lines.append(f"recipe fingerprint: {self.recipe_fingerprint}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()
