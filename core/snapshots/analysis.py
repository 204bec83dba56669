"""What a snapshot says: active memory over time, its peak, what was live then and who
allocated it, the allocator's segments at the end.

Pure functions of a :class:`~torchmem.snapshots.index.SnapshotIndex`, shared by
``torchmem snapshot info`` and the Snapshot window.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from torchmem.snapshots.index import ALLOC, FREE, FREE_COMPLETED, SnapshotIndex

#: The categories a stack is sorted into, as Mosaic and memory_viz users read them.
CATEGORIES = ("parameter", "optimizer state", "gradient", "activation", "other")
#: Frames of these files are PyTorch's own: the frame that owns an allocation is the
#: first one outside them (the user's line).
_LIBRARY = ("/torch/", "\\torch\\", "<frozen", "/site-packages/", "/dist-packages/")


@dataclass(frozen=True)
class Timeline:
    """Active (allocated) bytes of one device after each of its events."""

    time_us: np.ndarray
    active: np.ndarray
    #: The rows of the index's events these points are.
    events: np.ndarray
    #: Bytes live before the trace began.
    initial: int

    @property
    def peak(self) -> tuple[int, int, int]:
        """(bytes, time in µs, event row) of the highest point; (initial, 0, -1) when
        the trace is empty."""
        if not len(self.active):
            return self.initial, 0, -1
        i = int(np.argmax(self.active))
        return int(self.active[i]), int(self.time_us[i]), int(self.events[i])


def timeline(index: SnapshotIndex, device: int) -> Timeline:
    """Active bytes after each event of ``device`` (allocations minus completed frees)."""
    devices = index.ev_device
    if not (devices != device).any():  # one device: no gathers of it all
        mine, rows = np.arange(len(devices)), slice(None)
    else:
        mine = rows = np.flatnonzero(devices == device)
    action = index.ev_action[rows]
    sign = (action == ALLOC).astype(np.int8) - ((action == FREE_COMPLETED) | (action == FREE))
    active = index.ev_size[rows] * sign
    initial = int(index.al_size[(index.al_device == device) & (index.al_start < 0)].sum())
    np.cumsum(active, out=active)
    active += initial
    return Timeline(index.ev_time[rows], active, mine, initial)


def live_at(index: SnapshotIndex, device: int, event: int) -> np.ndarray:
    """Rows of the allocations of ``device`` live just after event row ``event``."""
    return np.flatnonzero(
        (index.al_device == device) & (index.al_start <= event) & (index.al_end > event)
    )


def owner(stack: list[str]) -> str:
    """The frame that owns an allocation: the first outside PyTorch's own files (the
    user's line), else the innermost frame."""
    for frame in stack:
        if not any(part in frame for part in _LIBRARY):
            return frame
    return stack[0] if stack else "(no stack recorded)"


def category(stack: list[str]) -> str:
    """What an allocation probably is, from its stack (one of :data:`CATEGORIES`)."""
    text = " ".join(stack)
    names = {frame.split(" (", 1)[0] for frame in stack}
    if "optim" in text and ("step" in names or "_init_group" in names):
        return "optimizer state"
    if names & {"backward", "_engine_run_backward", "run_backward"} or (
        "autograd" in text and ("backward" in text)
    ):
        return "gradient"
    if names & {"forward", "_call_impl", "_wrapped_call_impl"}:
        return "activation"
    if names & {"_apply", "reset_parameters", "__init__", "to", "cuda"} and "/nn/" in text:
        return "parameter"
    return "other"


@dataclass(frozen=True)
class StackGroup:
    """Live bytes owned by one frame."""

    frame: str
    bytes: int
    count: int
    category: str
    #: The full stack of its largest allocation, innermost first.
    stack: list[str]
    #: Tensor names of its allocations, largest first, where a census named them.
    tensors: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        """As ``torchmem snapshot info --json`` writes it."""
        return {
            "frame": self.frame,
            "bytes": self.bytes,
            "count": self.count,
            "category": self.category,
            "stack": self.stack,
            "tensors": list(self.tensors),
        }


def by_owner(index: SnapshotIndex, rows: np.ndarray, top: int | None = 10) -> list[StackGroup]:
    """Allocations ``rows`` grouped by the frame that owns them, largest first."""
    groups: dict[str, list[int]] = {}
    for row in rows.tolist():
        sid = int(index.al_stack[row])
        stack = index.stacks[sid] if sid >= 0 else []
        groups.setdefault(owner(stack), []).append(row)
    out = []
    names = index.tensor_names
    for frame, members in groups.items():
        sizes = index.al_size[members]
        largest = members[int(np.argmax(sizes))]
        sid = int(index.al_stack[largest])
        stack = index.stacks[sid] if sid >= 0 else []
        by_size = [members[i] for i in np.argsort(-sizes, kind="stable").tolist()]
        tensors = tuple(dict.fromkeys(names[r].name for r in by_size if r in names))
        out.append(StackGroup(
            frame, int(sizes.sum()), len(members), allocation_category(index, largest, stack),
            stack, tensors,
        ))  # fmt: skip
    out.sort(key=lambda g: -g.bytes)
    return out[:top] if top else out


def allocation_category(index: SnapshotIndex, row: int, stack: list[str] | None = None) -> str:
    """What allocation ``row`` is: its tensor's kind where a census named it, else the
    guess from its stack."""
    named = _census_category(index, row)
    if named is not None:
        return named
    if stack is None:
        sid = int(index.al_stack[row])
        stack = index.stacks[sid] if sid >= 0 else []
    return category(stack)


def by_category(index: SnapshotIndex, rows: np.ndarray) -> dict[str, int]:
    """Live bytes of ``rows`` per category."""
    totals = dict.fromkeys(CATEGORIES, 0)
    cache: dict[int, str] = {}
    for row in rows.tolist():
        kind = _census_category(index, row)
        if kind is None:
            sid = int(index.al_stack[row])
            if sid not in cache:
                cache[sid] = category(index.stacks[sid]) if sid >= 0 else "other"
            kind = cache[sid]
        totals[kind] += int(index.al_size[row])
    return totals


def _census_category(index: SnapshotIndex, row: int) -> str | None:
    """The category of allocation ``row``'s tensor where a census named it and its kind
    says more than the stack (None otherwise)."""
    named = index.tensor_names.get(row)
    return named.category if named is not None else None


@dataclass(frozen=True)
class SegmentSummary:
    """The allocator's segments of one device at the end of the snapshot."""

    segments: int
    reserved: int
    allocated: int
    #: Bytes cached but free inside segments that also hold allocations: the memory
    #: fragmentation keeps from a large request.
    inactive_split: int

    @property
    def fragmentation(self) -> float:
        """The share of reserved bytes not allocated (0 when nothing is reserved)."""
        return 1 - self.allocated / self.reserved if self.reserved else 0.0


def segments(index: SnapshotIndex, device: int) -> SegmentSummary:
    """Segments, reserved and allocated bytes, and split free bytes of ``device``."""
    mine = index.seg_device == device
    split = (index.seg_allocated > 0) & mine
    return SegmentSummary(
        segments=int(mine.sum()),
        reserved=int(index.seg_total[mine].sum()),
        allocated=int(index.seg_allocated[mine].sum()),
        inactive_split=int((index.seg_total[split] - index.seg_allocated[split]).sum()),
    )


@dataclass(frozen=True)
class StackedCurves:
    """Active bytes of one device per category, ready to draw at any zoom: the whole
    trace thinned once (:meth:`whole`), and any stretch of it thinned again at the same
    resolution when the view narrows to it (:meth:`between`), so that a zoom shows the
    stretch's own troughs and steps rather than the whole trace's few points in it."""

    line: Timeline
    #: Each of the line's events' category, as an index into CATEGORIES.
    codes: np.ndarray
    #: Each category's bytes live before the trace began.
    initial: dict[str, int]
    #: The positions in the line kept for the whole trace, and each category's bytes there.
    keep: np.ndarray
    totals: dict[str, np.ndarray]

    def whole(self) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """(times, bytes by category, event rows) of the whole trace, thinned."""
        return self.line.time_us[self.keep], self.totals, self.line.events[self.keep]

    def between(
        self, lo: int, hi: int, max_points: int = 4000
    ) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        """As :meth:`whole`, for the line's positions ``lo`` to ``hi`` (both included),
        thinned to about ``max_points`` of their own. Costs the stretch's length, plus at
        most one bucket of the whole trace before it (where its totals are known)."""
        n = len(self.line.active)
        lo, hi = max(0, lo), min(n - 1, hi)
        if n == 0 or hi < lo:
            empty = np.zeros(0, dtype=np.int64)
            return np.zeros(0), {c: empty for c in CATEGORIES}, empty
        points = lo + thin(self.line.active[lo : hi + 1], max_points)
        # Every category's bytes are known at the whole trace's last point before the
        # first one (or before the trace): from there, what the events changed.
        j = int(np.searchsorted(self.keep, points[0], side="left")) - 1
        origin = int(self.keep[j]) if j >= 0 else -1
        start = {c: int(self.totals[c][j]) for c in CATEGORIES} if j >= 0 else self.initial
        stop = int(points[-1]) + 1
        curves = _sums_at(
            self.codes[origin + 1 : stop], _deltas(self.line, origin + 1, stop), start,
            points - (origin + 1),
        )  # fmt: skip
        return self.line.time_us[points], curves, self.line.events[points]


def _deltas(line: Timeline, start: int, stop: int) -> np.ndarray:
    """What each event of ``line`` at positions ``start`` to ``stop - 1`` changed: the
    timeline is their running sum from the initial bytes."""
    before = line.active[start - 1] if start > 0 else line.initial
    return np.diff(line.active[start:stop], prepend=before)


def _sums_at(
    codes: np.ndarray, delta: np.ndarray, start: dict[str, int], ends: np.ndarray
) -> dict[str, np.ndarray]:
    """Each category's bytes at ``ends`` (increasing indices into ``codes`` and
    ``delta``, the last one the last index): ``start``, plus its changes summed over the
    stretch that ends at each point, then the stretches added up. A running sum of every
    event for every category took 1.3 s at ten million events."""
    starts = np.r_[0, ends[:-1] + 1]  # never empty: the first end is at 0 or after
    present = np.bincount(codes, minlength=len(CATEGORIES))
    return {
        c: start[c] + np.cumsum(np.add.reduceat(np.where(codes == i, delta, 0), starts))
        if present[i] else np.full(len(ends), start[c], dtype=np.int64)
        for i, c in enumerate(CATEGORIES)
    }  # fmt: skip


def stacked_curves(
    index: SnapshotIndex, device: int, max_points: int = 4000, line: Timeline | None = None
) -> StackedCurves:
    """Active bytes of ``device`` per category after each event, thinned for the whole
    trace to at most ``max_points`` points that keep each bucket's highest total (a peak
    is never drawn lower than it was). ``line``: the device's :func:`timeline`, where the
    caller has it already."""
    line = line if line is not None else timeline(index, device)
    rows = line.events
    initial = by_category(index, np.flatnonzero((index.al_device == device) & (index.al_start < 0)))
    if not len(rows):
        empty = np.zeros(0, dtype=np.int64)
        return StackedCurves(line, np.zeros(0, np.int8), initial, empty,
                             {c: empty for c in CATEGORIES})  # fmt: skip
    code = {c: i for i, c in enumerate(CATEGORIES)}
    stack_cat = np.array(
        [code[category(s)] for s in index.stacks] + [code["other"]], dtype=np.int8
    )  # the last entry: events without a stack (-1)
    # One device holds every row: its columns whole, no gather of ten million.
    stacks = index.ev_stack if len(rows) == len(index.ev_stack) else index.ev_stack[rows]
    cats = stack_cat[stacks]
    delta = _deltas(line, 0, len(rows))
    # A free's own frames are empty: it takes the category of the alloc it ends.
    owners = np.full(len(index.ev_time), -1, dtype=np.int32)
    ended = index.al_end < len(owners)
    owners[index.al_end[ended]] = index.al_stack[ended]
    freed = delta < 0
    cats[freed] = stack_cat[owners[rows[freed]]]
    if index.tensor_names:  # a census's kind beats the stack's guess, alloc and free alike
        named = np.full(len(index.ev_time), -1, dtype=np.int8)
        for row, tensor in index.tensor_names.items():
            if tensor.category is None:
                continue
            for event in (int(index.al_start[row]), int(index.al_end[row])):
                if 0 <= event < len(named):
                    named[event] = code[tensor.category]
        cats = np.where(named[rows] >= 0, named[rows], cats)
    keep = thin(line.active, max_points)
    return StackedCurves(line, cats, initial, keep, _sums_at(cats, delta, initial, keep))


def category_curves(
    index: SnapshotIndex, device: int, max_points: int = 4000, line: Timeline | None = None
) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
    """(times, bytes by category, the event rows kept) of the whole trace: see
    :func:`stacked_curves`."""
    return stacked_curves(index, device, max_points, line).whole()


def thin(values: np.ndarray, max_points: int) -> np.ndarray:
    """Indices of at most about ``max_points`` of ``values`` for drawing: each bucket's
    first and highest, in order (a peak is never drawn lower than it was)."""
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    buckets = max(max_points // 2, 1)
    edges = np.linspace(0, n, buckets + 1, dtype=np.int64)
    keep = []
    for lo, hi in itertools.pairwise(edges):
        if hi > lo:
            keep += [lo, lo + int(np.argmax(values[lo:hi]))]
    keep.append(n - 1)
    return np.unique(np.asarray(keep))


@dataclass(frozen=True)
class OwnerDiff:
    """Live bytes at the peak owned by one line, in two snapshots."""

    frame: str
    before: int
    after: int
    category: str

    @property
    def change(self) -> int:
        """``after - before``."""
        return self.after - self.before

    def to_json(self) -> dict[str, object]:
        """As ``torchmem snapshot diff --json`` writes it."""
        return {
            "frame": self.frame,
            "before_bytes": self.before,
            "after_bytes": self.after,
            "change_bytes": self.change,
            "category": self.category,
        }


def compare_peaks(
    before: SnapshotIndex, after: SnapshotIndex, device: int = 0
) -> tuple[int, int, list[OwnerDiff]]:
    """Each snapshot's peak active bytes on ``device``, and the lines holding memory at
    either peak with what they held in each, largest change first (a line only one of
    them has shows 0 in the other)."""
    peaks, owners = [], []
    for index in (before, after):
        line = timeline(index, device)
        peak, _, event = line.peak
        peaks.append(peak)
        owners.append({g.frame: g for g in by_owner(index, live_at(index, device, event), None)})
    frames = set(owners[0]) | set(owners[1])
    diffs = [
        OwnerDiff(
            frame,
            owners[0][frame].bytes if frame in owners[0] else 0,
            owners[1][frame].bytes if frame in owners[1] else 0,
            (owners[1].get(frame) or owners[0][frame]).category,
        )
        for frame in frames
    ]
    diffs.sort(key=lambda d: (-abs(d.change), d.frame))
    return peaks[0], peaks[1], diffs


SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP = 3, 4, 5, 6


@dataclass(frozen=True)
class SegmentState:
    """One segment of the allocator at a moment: its span and what is allocated in it."""

    address: int
    size: int
    allocated: int
    #: The largest stretch of it with no live allocation: the largest request it could
    #: still serve without asking the device for more.
    largest_free: int
    #: The live allocations inside it, by address: (offset in the segment, size, category).
    blocks: tuple[tuple[int, int, str], ...] = ()


def traces_segments(index: SnapshotIndex, device: int) -> bool:
    """True when the trace of ``device`` records its segments' allocs and frees (so the
    allocator's state at any moment can be rebuilt, not only at the end)."""
    kinds = index.ev_action[index.ev_device == device]
    return bool(np.isin(kinds, (SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP)).any())


def segments_at(index: SnapshotIndex, device: int, event: int) -> list[SegmentState]:
    """The segments of ``device`` just after event row ``event``, from the segment events
    of the trace (and the segments at the end that no event mentions), each with the
    allocations live then that fall inside it; by address."""
    mine = np.flatnonzero(index.ev_device == device)
    kinds = index.ev_action[mine]
    is_seg = np.isin(kinds, (SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP))
    seg_rows = mine[is_seg]
    segs: dict[int, int] = {}
    seen: set[int] = set()
    for row in seg_rows.tolist():  # segments freed in the trace without an alloc: old ones
        addr = int(index.ev_addr[row])
        if addr not in seen and index.ev_action[row] in (SEGMENT_FREE, SEGMENT_UNMAP):
            segs[addr] = int(index.ev_size[row])
        seen.add(addr)
    end = index.seg_device == device
    for addr, size in zip(index.seg_addr[end].tolist(), index.seg_total[end].tolist(), strict=True):
        if addr not in seen:
            segs[addr] = size  # there all along
    for row in seg_rows[seg_rows <= event].tolist():
        addr, size = int(index.ev_addr[row]), int(index.ev_size[row])
        if index.ev_action[row] in (SEGMENT_ALLOC, SEGMENT_MAP):
            segs[addr] = segs.get(addr, 0) + size if index.ev_action[row] == SEGMENT_MAP else size
        else:
            segs.pop(addr, None)
    if not segs:
        return []
    starts = np.array(sorted(segs), dtype=np.uint64)
    live = live_at(index, device, event)
    addrs, sizes, stacks = index.al_addr[live], index.al_size[live], index.al_stack[live]
    owner = np.searchsorted(starts, addrs, side="right") - 1
    kinds: dict[int, str] = {}
    out = []
    for i, start in enumerate(starts.tolist()):
        size = segs[start]
        inside = (owner == i) & (addrs < start + size)
        order = np.argsort(addrs[inside])
        a, s = addrs[inside][order].astype(np.int64), sizes[inside][order]
        edges = np.r_[start, a + s]
        gaps = np.r_[a, start + size] - edges
        blocks = []
        for addr, nbytes, sid in zip(
            a.tolist(), s.tolist(), stacks[inside][order].tolist(), strict=True
        ):
            if sid not in kinds:
                kinds[sid] = category(index.stacks[sid]) if sid >= 0 else "other"
            blocks.append((addr - start, int(nbytes), kinds[sid]))
        out.append(SegmentState(start, size, int(s.sum()), int(max(gaps.max(), 0)), tuple(blocks)))
    return out
