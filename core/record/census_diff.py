"""Any two censuses of a recorded run, compared by name: what is new, freed and grown.

Storages are matched by the name of their best tensor, not by address: between two steps
a script's activations are freed and allocated again at other addresses, so an address
diff would list every one of them as new and freed; by name, ``batch`` is one row whose
size did not change. Indices fold as in leak culprits (``losses[12]`` and ``losses[13]``
are ``losses[#]``), so one growing list is one row that grew, with its count.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from torchmem.events import CensusTaken
from torchmem.leaks.culprits import name_pattern
from torchmem.record.store import SessionFile
from torchmem.tensors.model import KIND_LABELS, Census

_FOLDED = re.compile(r"^\([\d,]+ smaller storages\)$")


@dataclass
class NameDiff:
    """One name in two censuses: bytes and storages before and after."""

    name: str
    kind: str
    before: int
    after: int
    count_before: int
    count_after: int

    @property
    def delta(self) -> int:
        """Bytes gained (negative: freed)."""
        return self.after - self.before

    @property
    def change(self) -> str:
        """``new``, ``freed``, ``grown`` or ``shrunk``."""
        if not self.count_before:
            return "new"
        if not self.count_after:
            return "freed"
        return "grown" if self.delta > 0 else "shrunk"


def recorded_censuses(path: str | Path) -> list[CensusTaken]:
    """Every census a session file holds, oldest first (RecordError if unreadable)."""
    with SessionFile(path) as file:
        return [e for e in file.events() if isinstance(e, CensusTaken)]


def _by_name(census: Census) -> dict[str, tuple[str, int, int]]:
    out: dict[str, tuple[str, int, int]] = {}
    for storage in census.storages.values():
        name = name_pattern(storage.name)
        if _FOLDED.match(name):  # a recording's fold of small storages, per kind
            name = f"(smaller storages: {KIND_LABELS.get(storage.kind, storage.kind)})"
        kind, nbytes, count = out.get(name, (storage.kind, 0, 0))
        out[name] = (kind, nbytes + storage.nbytes, count + 1)
    return out


def diff_by_name(before: Census, after: Census) -> list[NameDiff]:
    """The names whose bytes changed between two censuses, largest change first."""
    a, b = _by_name(before), _by_name(after)
    rows = []
    for name in a.keys() | b.keys():
        kind_a, bytes_a, count_a = a.get(name, ("", 0, 0))
        kind_b, bytes_b, count_b = b.get(name, ("", 0, 0))
        if bytes_a != bytes_b or count_a != count_b:
            rows.append(NameDiff(name, kind_b or kind_a, bytes_a, bytes_b, count_a, count_b))
    rows.sort(key=lambda r: (-abs(r.delta), r.name))
    return rows
