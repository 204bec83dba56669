"""Read a PyTorch memory snapshot pickle, safely, with progress.

A snapshot (``torch.cuda.memory._dump_snapshot``) is a pickle of plain data: dicts,
lists, strings and numbers (protocols 2-5). Unpickling runs whatever classes a file
names, so the reader refuses every class: a snapshot needs none, and a file that names
one (a ``torch.save`` checkpoint, anything else) is not a snapshot and is said to be so
before it can run code.
"""

from __future__ import annotations

import io
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any


class SnapshotError(Exception):
    """The file is not a snapshot torchmem can read; the message says what it is."""


class _Counted(io.RawIOBase):
    """A file that reports how far it has been read (for a progress bar)."""

    def __init__(self, f: Any, size: int, progress: Callable[[float], None]) -> None:
        self.f, self.size, self.progress = f, max(size, 1), progress
        self.done = 0
        self._reported = -1.0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        """Read into ``buffer``, and report the share of the file read so far."""
        n = self.f.readinto(buffer)
        self.done += n or 0
        share = self.done / self.size
        if share - self._reported >= 0.01:
            self._reported = share
            self.progress(min(share, 1.0))
        return n


class _PlainData(pickle.Unpickler):
    """An unpickler that builds plain data only."""

    def find_class(self, module: str, name: str) -> Any:
        """Sets only (plain data); any other class is refused before it can run."""
        if (module, name) in (("builtins", "set"), ("builtins", "frozenset")):
            return {"set": set, "frozenset": frozenset}[name]
        raise SnapshotError(
            f"the file holds Python objects ({module}.{name}), which a memory snapshot "
            "never does: it is not a snapshot (a torch.save checkpoint?). Save one with "
            "torch.cuda.memory._dump_snapshot(path)"
        )


def read_snapshot(
    path: str | os.PathLike[str], progress: Callable[[float], None] | None = None
) -> dict[str, Any]:
    """The snapshot at ``path`` as plain data; SnapshotError (one line) for a missing,
    empty, truncated, foreign or unrecognised file."""
    file = Path(path)
    try:
        size = file.stat().st_size
    except OSError as exc:
        raise SnapshotError(f"cannot read {path}: {exc.strerror or exc}") from None
    if size == 0:
        raise SnapshotError(f"{path} is empty")
    try:
        with file.open("rb") as raw:
            head = raw.read(2)
            raw.seek(0)
            if not head or head[0] != 0x80:
                raise SnapshotError(
                    f"{path} is not a pickle (it starts with {head!r}): a memory snapshot "
                    "is the pickle torch.cuda.memory._dump_snapshot writes"
                )
            if head[1] > pickle.HIGHEST_PROTOCOL:
                raise SnapshotError(
                    f"{path} uses pickle protocol {head[1]}, newer than this Python reads "
                    f"({pickle.HIGHEST_PROTOCOL})"
                )
            source: Any = raw
            if progress is not None:
                source = io.BufferedReader(_Counted(raw, size, progress), 1 << 20)
            data = _PlainData(source).load()
    except SnapshotError:
        raise
    except (EOFError, pickle.UnpicklingError, ValueError, IndexError, TypeError) as exc:
        raise SnapshotError(
            f"{path} is truncated or damaged ({type(exc).__name__}: {exc}); a snapshot "
            "cut short while it was written cannot be read"
        ) from None
    except MemoryError:
        raise SnapshotError(f"{path} does not fit in this machine's memory") from None
    except OSError as exc:
        raise SnapshotError(f"cannot read {path}: {exc.strerror or exc}") from None
    return check_snapshot(data, str(path))


#: A segment of an old snapshot (a list of segments) has some of these.
SEGMENT_KEYS = frozenset({"address", "total_size", "blocks", "segment_type"})


def check_snapshot(data: Any, name: str = "the file") -> dict[str, Any]:
    """``data`` if it has a snapshot's shape (segments, device traces); SnapshotError
    saying what it has instead."""
    if isinstance(data, list):  # torch < 2.1 dumped the segments alone
        if not all(isinstance(s, dict) and SEGMENT_KEYS & s.keys() for s in data):
            first = next(s for s in data if not (isinstance(s, dict) and SEGMENT_KEYS & s.keys()))
            raise SnapshotError(
                f"{name} is a pickle of a list of {type(first).__name__}, not a memory "
                "snapshot (a dict with 'segments' and 'device_traces', or before torch 2.1 "
                "a list of segments)"
            )
        data = {"segments": data, "device_traces": []}
    if not isinstance(data, dict) or "segments" not in data:
        kind = type(data).__name__
        keys = f" with keys {', '.join(map(str, list(data)[:5]))}" if isinstance(data, dict) else ""
        raise SnapshotError(
            f"{name} is a pickle of a {kind}{keys}, not a memory snapshot (which has "
            "'segments' and 'device_traces')"
        )
    if not isinstance(data["segments"], list) or not isinstance(
        data.get("device_traces", []), list
    ):
        raise SnapshotError(f"{name} has 'segments' but not in the format of torch 2.1 or later")
    data.setdefault("device_traces", [])
    return data
