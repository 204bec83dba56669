"""A snapshot as columns: every trace event and every allocation's lifetime in numpy
arrays, stacks interned once, saved beside as a folder of ``.npy`` files.

memory_viz keeps every event as a JavaScript object and its browser tab dies near 1 GB;
here the pickle is read once (in a worker process, :mod:`torchmem.snapshots.open`) and
what the views need is a few arrays of a dozen bytes an event, reopened in a moment.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from torchmem.snapshots.scan import ScannedSnapshot

#: Version of the index format: an index of another version is rebuilt.
INDEX_VERSION = 2
#: The file of an index folder that holds its stacks, facts and version; written last.
EXTRA_FILE = "extra.json"
#: An index being saved is written beside its folder, named with this and the saver's pid.
SAVING = ".tmp"
#: The trace actions, by code (``free`` is torch 2.0's name of ``free_requested``).
ACTIONS = (
    "alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
    "segment_map", "segment_unmap", "snapshot", "oom", "free",
)  # fmt: skip
ALLOC, FREE_REQUESTED, FREE_COMPLETED, FREE = 0, 1, 2, 9
UNKNOWN_ACTION = 127
#: Block states, by code.
STATES = ("active_allocated", "active_pending_free", "inactive")


@dataclass
class SnapshotIndex:
    """Every event and allocation of a snapshot, as arrays (one row each)."""

    #: Trace events, in trace order: device, time (µs), action code, address, size, stack.
    ev_device: np.ndarray
    ev_time: np.ndarray
    ev_action: np.ndarray
    ev_addr: np.ndarray
    ev_size: np.ndarray
    ev_stack: np.ndarray
    #: Allocations (an alloc paired with its free): device, first and last event index
    #: (-1: live before the trace began; len(events): still live at its end), address,
    #: size, stack.
    al_device: np.ndarray
    al_start: np.ndarray
    al_end: np.ndarray
    al_addr: np.ndarray
    al_size: np.ndarray
    al_stack: np.ndarray
    #: Segments at the end: device, address, total, allocated, active bytes, large pool.
    seg_device: np.ndarray
    seg_addr: np.ndarray
    seg_total: np.ndarray
    seg_allocated: np.ndarray
    seg_active: np.ndarray
    seg_large: np.ndarray
    #: Blocks at the end: segment row, address, size, state code.
    blk_segment: np.ndarray
    blk_addr: np.ndarray
    blk_size: np.ndarray
    blk_state: np.ndarray
    #: Interned stacks: each a list of "name (file:line)", innermost first.
    stacks: list[list[str]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    #: Allocation row -> its tensor's name (a :class:`~torchmem.snapshots.names.TensorName`),
    #: matched when the snapshot is opened; not saved in the index.
    tensor_names: dict[int, Any] = field(default_factory=dict)

    @property
    def devices(self) -> list[int]:
        """The devices with events or segments, in order."""
        return sorted({int(d) for d in np.unique(self.ev_device)} | {
            int(d) for d in np.unique(self.seg_device)
        })  # fmt: skip

    def save(self, path: str | Path) -> None:
        """Write the index to the folder ``path``: one ``.npy`` file per array, and the
        stacks and facts in :data:`EXTRA_FILE`. The folder appears whole or not at all
        (written beside, then renamed); one already there is replaced."""
        path = Path(path)
        tmp = path.with_name(f"{path.name}{SAVING}{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            for name, value in vars(self).items():
                if isinstance(value, np.ndarray):
                    np.save(tmp / f"{name}.npy", value, allow_pickle=False)
            extra = {"stacks": self.stacks, "meta": self.meta, "version": INDEX_VERSION}
            (tmp / EXTRA_FILE).write_text(json.dumps(extra))
            if path.is_dir():  # an index of another version, or a damaged one
                shutil.rmtree(path)
            os.rename(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @classmethod
    def load(cls, path: str | Path) -> SnapshotIndex | None:
        """The index in the folder ``path``, or None if missing, damaged or of another
        version. Its arrays map the files rather than read them (a 10 million event index
        is half a GiB: reading it back took 0.64 s), so pages load as the views touch
        them; they are read-only."""
        path = Path(path)
        try:
            extra = json.loads((path / EXTRA_FILE).read_text())
            if extra.get("version") != INDEX_VERSION:
                return None
            kept = ("stacks", "meta", "tensor_names")
            names = [f for f in cls.__dataclass_fields__ if f not in kept]
            # np.asarray: a plain array over the mapping (numpy.memmap's subclass hooks
            # would run on every slice the views take).
            arrays = {
                name: np.asarray(np.load(path / f"{name}.npy", mmap_mode="r")) for name in names
            }
            return cls(**arrays, stacks=extra["stacks"], meta=extra["meta"])
        except (OSError, ValueError, KeyError, EOFError, AttributeError, TypeError):
            return None


class _Stacks:
    """Interns stacks: the same frames get the same id."""

    def __init__(self) -> None:
        self.ids: dict[tuple[str, ...], int] = {}
        self.stacks: list[list[str]] = []

    def id_of(self, frames: Any) -> int:
        """The id of the stack ``frames`` (a snapshot's list of frame dicts); -1 for none."""
        if not frames:
            return -1
        try:  # the raw values as the key: formatting happens once per distinct stack
            # A frame is its name, file and line, as the scanner interns it: a key more
            # (a column) must not make the same stack two.
            key = tuple([(f.get("name"), f.get("filename"), f.get("line")) for f in frames])
        except AttributeError:  # not a list of dicts
            return -1
        found = self.ids.get(key)
        if found is None:
            found = self.ids[key] = len(self.stacks)
            self.stacks.append([
                f"{f.get('name', '?')} ({f.get('filename', '?')}:{f.get('line', '?')})"
                for f in frames
            ])  # fmt: skip
        return found


def build_index(
    snapshot: dict[str, Any],
    meta: dict[str, Any] | None = None,
    progress: Callable[[float], None] | None = None,
) -> SnapshotIndex:
    """The index of a snapshot read by :func:`~torchmem.snapshots.read.read_snapshot`."""
    stacks = _Stacks()
    return _assemble(snapshot, _event_columns(snapshot, stacks, progress), stacks, meta)


def index_scanned(scanned: ScannedSnapshot, meta: dict[str, Any] | None = None) -> SnapshotIndex:
    """The index of a snapshot read by :func:`~torchmem.snapshots.scan.scan_snapshot`:
    the same arrays, stacks and facts as :func:`build_index` gives for that file."""
    stacks = _Stacks()
    for ids in scanned.stacks:  # the scanner's stack ids stay the index's
        stacks.id_of([dict(zip(("name", "filename", "line"), scanned.frames[i], strict=True))
                      for i in ids])  # fmt: skip
    return _assemble(scanned.data, scanned.events, stacks, meta)


def _event_columns(
    snapshot: dict[str, Any], stacks: _Stacks, progress: Callable[[float], None] | None
) -> list[np.ndarray]:
    codes = {name: i for i, name in enumerate(ACTIONS)}
    traces = snapshot.get("device_traces") or []
    total = sum(len(t) for t in traces if isinstance(t, list)) or 1
    columns: list[list[int]] = [[], [], [], [], [], []]
    done = 0
    for device, trace in enumerate(traces):
        if not isinstance(trace, list):
            continue
        dev, times, actions, addrs, sizes, ids = (c.append for c in columns)
        id_of, code_of = stacks.id_of, codes.get
        for i, e in enumerate(trace):  # the hot loop of a multi-million-event file
            if not isinstance(e, dict):
                continue
            get = e.get
            dev(device)
            times(get("time_us", i))  # traces before torch 2.1 have no times: their order
            actions(code_of(get("action", ""), UNKNOWN_ACTION))
            addrs(get("addr", 0))
            sizes(get("size", 0))
            ids(id_of(get("frames")))
        done += len(trace)
        if progress is not None:
            progress(done / total)
    return [np.asarray(c, dtype=t) for c, t in zip(
        columns, (np.int16, np.int64, np.int8, np.uint64, np.int64, np.int32), strict=True
    )]  # fmt: skip


def _assemble(
    snapshot: dict[str, Any], ev: list[np.ndarray], stacks: _Stacks, meta: dict[str, Any] | None
) -> SnapshotIndex:
    seg_rows, blk_rows = [], []
    for segment in snapshot.get("segments") or []:
        if not isinstance(segment, dict):
            continue
        row = len(seg_rows)
        seg_rows.append((
            int(segment.get("device", 0)), int(segment.get("address", 0)),
            int(segment.get("total_size", 0)), int(segment.get("allocated_size", 0)),
            int(segment.get("active_size", 0)), segment.get("segment_type", "large") == "large",
        ))  # fmt: skip
        for block in segment.get("blocks") or []:
            state = block.get("state", "inactive")
            blk_rows.append((
                row, int(block.get("address", 0)), int(block.get("size", 0)),
                STATES.index(state) if state in STATES else len(STATES) - 1,
                stacks.id_of(block.get("frames")),
            ))  # fmt: skip
    seg = _columns(seg_rows, (np.int16, np.uint64, np.int64, np.int64, np.int64, bool))
    blk = _columns(blk_rows, (np.int32, np.uint64, np.int64, np.int8, np.int32))
    allocations = _allocations(ev, seg, blk)
    facts = {
        "events": int(len(ev[0])),
        "segments": len(seg_rows),
        "allocator_settings": snapshot.get("allocator_settings") or {},
        **(meta or {}),
    }
    return SnapshotIndex(
        *ev, *allocations, *seg, blk[0], blk[1], blk[2], blk[3], stacks=stacks.stacks, meta=facts
    )


def _columns(rows: list[tuple[Any, ...]], types: Iterable[Any]) -> list[np.ndarray]:
    types = list(types)
    if not rows:
        return [np.zeros(0, dtype=t) for t in types]
    return [np.asarray(col, dtype=t) for col, t in zip(zip(*rows, strict=True), types, strict=True)]


def _allocations(
    ev: list[np.ndarray], seg: list[np.ndarray], blk: list[np.ndarray]
) -> list[np.ndarray]:
    """Pair each alloc with the free that ends it (free_completed, or torch 2.0's free),
    by address and trace order; a free with no alloc before it was live when the trace
    began, and so is a block live at the end that no event mentions."""
    device, _, action, addr, size, stack = ev
    n = len(device)
    is_alloc = action == ALLOC
    idx = np.flatnonzero(is_alloc | (action == FREE_COMPLETED) | (action == FREE))
    ad = addr[idx]
    if not (device != device[:1]).any():  # one device: a sort and a gather fewer
        order = np.argsort(ad, kind="stable")
        idx, ad = idx[order], ad[order]
        dev = np.broadcast_to(device[:1], idx.shape)
    else:
        dev = device[idx]
        order = np.lexsort((idx, ad, dev))
        idx, dev, ad = idx[order], dev[order], ad[order]
    alloc = is_alloc[idx]
    same_next = np.zeros(len(idx), dtype=bool)
    if len(idx) > 1:
        same_next[:-1] = (dev[1:] == dev[:-1]) & (ad[1:] == ad[:-1])
    paired = alloc & same_next & np.r_[~alloc[1:], False]
    ends = np.where(paired, np.r_[idx[1:], 0], n)
    # Frees whose previous event at that address is not an alloc: live before the trace.
    same_prev = np.r_[False, same_next[:-1]]
    orphan = ~alloc & ~(same_prev & np.r_[False, alloc[:-1]])
    a_idx = idx[alloc]
    starts = np.r_[a_idx, np.full(int(orphan.sum()), -1)]
    ends_all = np.r_[ends[alloc], idx[orphan]]
    rows = np.r_[a_idx, idx[orphan]]
    # copy=False: a gathered column is new already (a copy of 10 million rows each was a
    # quarter of a second).
    al = [
        device[rows].astype(np.int16, copy=False),
        starts.astype(np.int64, copy=False),
        ends_all.astype(np.int64, copy=False),
        addr[rows].astype(np.uint64, copy=False),
        size[rows].astype(np.int64, copy=False),
        stack[rows].astype(np.int32, copy=False),
    ]
    # Blocks allocated at the end that the trace never mentions: live all along.
    seg_device = seg[0]
    blk_segment, blk_addr, blk_size, blk_state, blk_stack = blk
    if len(blk_addr):
        allocated = blk_state == STATES.index("active_allocated")
        b_dev = seg_device[blk_segment].astype(np.int16) if len(seg_device) else blk_segment
        silent = allocated & ~_mentioned(b_dev, blk_addr, dev, ad)  # the events paired
        if silent.any():
            k = int(silent.sum())
            extra = [
                b_dev[silent].astype(np.int16), np.full(k, -1, dtype=np.int64),
                np.full(k, n, dtype=np.int64), blk_addr[silent].astype(np.uint64),
                blk_size[silent].astype(np.int64), blk_stack[silent].astype(np.int32),
            ]  # fmt: skip
            al = [np.r_[a, b] for a, b in zip(al, extra, strict=True)]
    return al


def _mentioned(
    blk_device: np.ndarray, blk_addr: np.ndarray, ev_device: np.ndarray, ev_addr: np.ndarray
) -> np.ndarray:
    """Whether an event names each block's device and address: the events are looked up
    among the blocks (a few thousand), sorted, rather than gathered in a set (ten million
    tuples took a second)."""
    out = np.zeros(len(blk_addr), dtype=bool)
    for d in np.unique(blk_device):
        mine = np.flatnonzero(blk_device == d)
        order = mine[np.argsort(blk_addr[mine], kind="stable")]
        keys = blk_addr[order]
        ev = ev_addr[ev_device == d]
        at = np.minimum(np.searchsorted(keys, ev), len(keys) - 1)
        named = np.unique(ev[keys[at] == ev])
        out[order[np.isin(keys, named)]] = True
    return out


def dead_saves(folder: Path) -> list[Path]:
    """The half-written indexes in ``folder`` whose saving process is gone."""
    dead = []
    for half in folder.glob(f"*.index{SAVING}*"):
        pid = half.name.rsplit(SAVING, 1)[1]
        if not (pid.isdigit() and psutil.pid_exists(int(pid))):
            dead.append(half)
    return dead
