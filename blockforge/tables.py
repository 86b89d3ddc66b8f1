"""Tables for people: plain text for terminals, Markdown for summaries and model cards."""

from __future__ import annotations


def fmt(value) -> str:
    """A table cell: '-' for missing, four significant digits for floats, str() otherwise."""
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _default_align(headers: list[str], rows: list[list]) -> str:
    return "".join("r" if rows and isinstance(rows[0][i], (int, float)) else "l" for i in range(len(headers)))


def text_table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """A plain-text table; `align` has one 'l' or 'r' per column (default: text left, numbers right)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    align = align or _default_align(headers, rows)
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if a == "r" else c.ljust(w) for c, w, a in zip(row, widths, align)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown_table(headers: list[str], rows: list[list], align: str | None = None) -> str:
    """A Markdown table; `align` as for text_table, or None for the renderer's default."""
    rule = "|".join("---:" if a == "r" else "---" for a in align) if align else "|".join("---" for _ in headers)
    lines = ["| " + " | ".join(str(h) for h in headers) + " |", "|" + rule + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
