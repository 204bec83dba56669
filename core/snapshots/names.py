"""Tensor names for a snapshot's allocations, from the censuses of the run that wrote it.

A snapshot knows each allocation's address, size and stack; a census knows each storage's
address, size and name (``model.fc.weight``, an Adam state, a script variable). When
torchmem saves a snapshot it writes the newest censuses beside it
(:func:`~torchmem.probe.commands.names_path`), each with the Unix time it was taken, the
clock of the snapshot's ``time_us``. An allocation gets a name when a census taken while
it was live has a storage at its address on its device: the same address later belongs
to another tensor, so the time matters as much as the address.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from torchmem.probe.commands import names_path
from torchmem.snapshots.index import SnapshotIndex

#: A census kind as the snapshot views' categories name it (None: keep the stack's guess).
CATEGORY_OF_KIND = {
    "parameter": "parameter",
    "gradient": "gradient",
    "optimizer_state": "optimizer state",
    "activation": "activation",
    "buffer": "other",
    "plain": None,
}


@dataclass(frozen=True)
class TensorName:
    """What a census called the storage at an allocation's address."""

    name: str
    kind: str
    step: int

    @property
    def category(self) -> str | None:
        """The snapshot category this kind is, or None when it says nothing more."""
        return CATEGORY_OF_KIND.get(self.kind)


def read_names(snapshot: str | os.PathLike[str]) -> tuple[list[dict], str]:
    """The censuses saved beside ``snapshot`` and a line saying what was found (empty when
    there is no file: a snapshot torchmem did not write)."""
    path = names_path(snapshot)
    try:
        data = json.loads(path.read_text())
        censuses = data["censuses"]
        for c in censuses:
            int(c["unix_us"]), int(c["step"]), list(c["storages"])
    except FileNotFoundError:
        return [], ""
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return [], f"the tensor names beside it ({path.name}) could not be read: {exc}"
    return censuses, ""


def match_names(index: SnapshotIndex, censuses: list[dict]) -> dict[int, TensorName]:
    """Allocation row -> the name of the storage at its address in a census taken while it
    was live (the newest such census)."""
    n = len(index.ev_time)
    # Live before the trace began (start -1) or still live at its end (end n): unbounded.
    times = np.r_[np.asarray(index.ev_time, dtype=np.float64), np.inf]
    start = np.where(index.al_start >= 0, times[np.clip(index.al_start, 0, n)], -np.inf)
    end = times[np.clip(index.al_end, 0, n)]
    found: dict[int, TensorName] = {}
    for census in sorted(censuses, key=lambda c: int(c["unix_us"])):  # newest last: it wins
        moment = float(census["unix_us"])
        live = np.flatnonzero((start <= moment) & (end > moment))
        if not len(live):
            continue
        by_place = {(int(index.al_device[r]), int(index.al_addr[r])): r for r in live.tolist()}
        for device, address, _nbytes, name, kind in census["storages"]:
            ordinal = _ordinal(device)
            row = by_place.get((ordinal, int(address))) if ordinal is not None else None
            if row is not None:
                found[row] = TensorName(str(name), str(kind), int(census["step"]))
    return found


def _ordinal(device: str) -> int | None:
    """``cuda:1`` -> 1 (a snapshot numbers its devices); None for other devices."""
    kind, _, number = str(device).partition(":")
    if kind != "cuda":
        return None
    return int(number) if number.isdigit() else 0
