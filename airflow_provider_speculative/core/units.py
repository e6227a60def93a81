"""Human-readable sizes, one format for the CLI, the plan's decisions and the UI."""

from __future__ import annotations


def format_bytes(n: int | float) -> str:
    """``n`` bytes as ``"512 B"``, ``"1.5 KiB"`` ... ``"3.0 TiB"`` (binary units, one decimal)."""
    if n < 1024:
        return f"{n:.0f} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if value < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} TiB"
