"""Writing a run summary (``--summary out.json``) so that a reader never sees half a file."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def int_peaks(peaks: dict[str, float]) -> dict[str, int]:
    """Peak bytes per series as a summary writes them (whole bytes)."""
    return {k: int(v) for k, v in peaks.items()}


def write_summary(path: str, data: dict[str, Any]) -> bool:
    """Write ``data`` as JSON to ``path`` atomically; on failure say why on stderr and
    return False (the caller picks the exit code)."""
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, out)
    except OSError as exc:
        sys.stderr.write(f"torchmem: cannot write the summary to {path}: {exc}\n")
        return False
    return True
