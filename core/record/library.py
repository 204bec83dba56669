"""The per-user folder of recorded sessions: where new ones go, listing them, the size cap.

The folder is platformdirs' user data directory (``~/.local/share/torchmem/sessions`` on
Linux), or ``$TORCHMEM_SESSIONS_DIR``. Listing reads each file's facts and span only (not
its events), so a folder of hundreds of sessions lists in a moment; a file that cannot be
read is listed with the reason instead of hiding it.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import platformdirs

from torchmem.record.store import SUFFIX, RecordError, SessionFile

#: Default cap on the folder's size: the oldest sessions go first beyond it.
DEFAULT_CAP_BYTES = 2 * 1024**3


def sessions_dir() -> Path:
    """The folder of this user's recorded sessions (not created here)."""
    override = os.environ.get("TORCHMEM_SESSIONS_DIR")
    if override:
        return Path(override)
    return platformdirs.user_data_path("torchmem", appauthor=False) / "sessions"


def new_session_path(script: str | None, folder: Path | None = None) -> Path:
    """A fresh file name for a session of ``script``: ``20261203-184511-train.tmsession``."""
    folder = folder or sessions_dir()
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(script).stem if script else "session")[:40]
    base = f"{datetime.now():%Y%m%d-%H%M%S}-{stem or 'session'}"
    path = folder / f"{base}{SUFFIX}"
    n = 1
    while path.exists():
        n += 1
        path = folder / f"{base}-{n}{SUFFIX}"
    return path


def file_bytes(path: Path) -> int:
    """Bytes on disk of a session, its WAL and index included."""
    total = 0
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(OSError):
            total += path.with_name(path.name + suffix).stat().st_size
    return total


@dataclass
class SessionEntry:
    """One session file as a listing shows it."""

    path: Path
    meta: dict[str, Any]
    samples: int
    last_t: float
    size: int
    error: str = ""

    @property
    def title(self) -> str:
        """The user's name for it, or its script's file name."""
        name = self.meta.get("title") or self.meta.get("script") or self.path.stem
        return Path(name).name if not self.meta.get("title") else str(name)

    @property
    def status(self) -> str:
        """How the run ended, as its summary says; unfinished files say so."""
        summary = self.meta.get("summary") or {}
        if self.error:
            return "unreadable"
        if not self.meta.get("complete"):
            return "interrupted"
        if self.meta.get("detached"):
            return "detached"
        return str(summary.get("status", "ended"))

    @property
    def peak_bytes(self) -> int | None:
        """The highest peak in its summary (None until the run ended)."""
        peaks = (self.meta.get("summary") or {}).get("peak_bytes") or {}
        return max(peaks.values(), default=None) if isinstance(peaks, dict) else None

    @property
    def alerts(self) -> int:
        """How many alerts its summary holds."""
        return len((self.meta.get("summary") or {}).get("alerts") or [])


def read_entry(path: Path) -> SessionEntry:
    """A listing's row for one file (with ``error`` set when it cannot be read)."""
    try:
        with SessionFile(path) as file:
            meta = file.meta()
            samples, last_t = file.span()
        return SessionEntry(path, meta, samples, last_t, file_bytes(path))
    except RecordError as exc:
        return SessionEntry(path, {}, 0, 0.0, file_bytes(path), error=str(exc))


def list_sessions(folder: Path | None = None) -> list[SessionEntry]:
    """Every session file in ``folder``, newest first."""
    folder = folder or sessions_dir()
    if not folder.is_dir():
        return []
    paths = sorted(folder.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime, reverse=True)
    return [read_entry(p) for p in paths]


def prune(
    folder: Path | None = None, cap_bytes: int = DEFAULT_CAP_BYTES, keep: tuple[Path, ...] = ()
) -> list[Path]:
    """Delete the oldest sessions until the folder fits in ``cap_bytes``; never those in
    ``keep`` (the ones being recorded). Returns what was deleted."""
    folder = folder or sessions_dir()
    if not folder.is_dir():
        return []
    paths = sorted(folder.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime)
    total = sum(file_bytes(p) for p in paths)
    deleted = []
    for path in paths:
        if total <= cap_bytes:
            break
        if path in keep:
            continue
        size = file_bytes(path)
        for suffix in ("", "-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
        total -= size
        deleted.append(path)
    return deleted
