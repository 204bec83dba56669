"""Byte units: one place that decides how memory figures are written, and read."""

from __future__ import annotations

import re

UNITS: dict[str, int] = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def auto_unit(nbytes: float) -> str:
    """Return the largest binary unit in which ``nbytes`` is at least 1 (B for tiny values)."""
    magnitude = abs(nbytes)
    chosen = "B"
    for name, factor in UNITS.items():
        if magnitude >= factor:
            chosen = name
    return chosen


def format_bytes(nbytes: float, unit: str | None = None, signed: bool = False) -> str:
    """Format a byte count, e.g. ``3.81 MiB``; ``signed`` adds a '+' to gains.

    Whole bytes are written without decimals and with thousands separators.
    """
    unit = unit or auto_unit(nbytes)
    sign = "+" if signed and nbytes > 0 else ""
    if unit == "B":
        return f"{sign}{int(round(nbytes)):,} B"
    value = nbytes / UNITS[unit]
    decimals = 2 if abs(value) < 100 else 1
    return f"{sign}{value:,.{decimals}f} {unit}"


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """``6GiB``, ``6G``, ``512 MiB``, ``1.5GB``, ``1000000`` as bytes. Binary and
    decimal suffixes both mean powers of 1024 (as nvidia-smi and PyTorch's summaries count).
    ValueError, saying what is accepted, for anything else."""
    match = _SIZE.match(str(text))
    if not match:
        raise ValueError(f"not a size: {text!r} (write e.g. 6GiB, 512MiB or a number of bytes)")
    number, prefix = float(match.group(1)), match.group(2).lower()
    factor = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[prefix]
    return int(number * factor)


def format_duration(seconds: float, coarse: bool = False) -> str:
    """``12.3 s``, ``4 min 05 s``, ``2 h 03 min``; ``coarse``: ``12 s``, ``3 min``, ``2 h``
    (the age of a reading)."""
    if seconds < 120:
        return f"{seconds:.0f} s" if coarse else f"{seconds:.1f} s"
    if seconds < 7200:
        if coarse:
            return f"{seconds / 60:.0f} min"
        return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"
    if coarse:
        return f"{seconds / 3600:.0f} h"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"
