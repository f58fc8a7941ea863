"""Plain-text tables for the benchmarks' output (no dependency, readable in CI logs)."""

from __future__ import annotations

from collections.abc import Iterable


def table(headers: list[str], rows: Iterable[list[str]], align: str) -> str:
    """Columns padded to their widest cell; `align` has one '<' or '>' per column."""
    rows = list(rows)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if a == "<" else c.rjust(w)
            for c, w, a in zip(cells, widths, align, strict=True)
        )

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])
