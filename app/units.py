"""How the app writes a number of bytes: one rule for every dialog and panel."""

from __future__ import annotations

KIB, MIB, GIB = 1024, 1024**2, 1024**3


def size_text(n: int) -> str:
    """Bytes in binary units, as the whole app writes them: "812 KiB", "98.2 MiB", "4.4 GiB"."""
    n = max(n, 0)
    if n >= GIB:
        return f"{n / GIB:,.1f} GiB"
    if n >= MIB:
        return f"{n / MIB:,.1f} MiB"
    return f"{n / KIB:,.0f} KiB"
