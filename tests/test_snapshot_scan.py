"""The native snapshot scanner: the index it gives equals the one pickle gives, on every
protocol and shape, and a damaged file is a clear error, never a crash."""

from __future__ import annotations

import pickle
import random
from typing import Any

import numpy as np
import pytest
from snapshot_files import (
    ACTIVATION,
    GRADIENT,
    PARAM,
    MiB,
    alloc,
    free,
    holed_segment_snapshot,
    random_snapshot,
    segment,
    small_snapshot,
    write,
)

from torchmem.snapshots import scan
from torchmem.snapshots.index import ACTIONS, SnapshotIndex, build_index, index_scanned
from torchmem.snapshots.open import index_snapshot
from torchmem.snapshots.read import SnapshotError, read_snapshot


def shared_frames_snapshot() -> dict[str, Any]:
    """Two devices, as torch writes them: block frames shared with the trace's (one
    object, pickled once and referred to after), a trace of torch 2.0 with no times, an
    empty trace, a free of a block live before the trace, and an unknown action."""
    seg = segment(0x1000, [(0x1000, 2 * MiB, "active_allocated"), (0x201000, MiB, "inactive")])
    seg["blocks"][0]["frames"] = PARAM
    untimed = [
        {k: v for k, v in e.items() if k != "time_us"}
        for e in [alloc(0x9000, MiB, 0, ACTIVATION), *free(0x9000, MiB, 0)]
    ]
    trace2 = [
        alloc(0x1000, 2 * MiB, 10, PARAM),  # the same frame objects as the block's
        {"action": "user_defined", "addr": 0, "size": 0, "stream": 0, "time_us": 11},
        alloc(0x7FFF_0000_0000, 3 * MiB, 12, GRADIENT),  # a 47-bit address: LONG1
        *free(0x1000, 2 * MiB, 13),
    ]
    return {
        "segments": [seg],
        "device_traces": [untimed, [], trace2],
        "allocator_settings": {"expandable_segments": False, "max_split_size": -1},
        "external_annotations": [{"device": 0, "stage": "START", "name": "fwd", "time_us": 1}],
    }


def both(path) -> tuple[SnapshotIndex, SnapshotIndex]:
    by_pickle = build_index(read_snapshot(path))
    scanned = scan.scan_snapshot(path, ACTIONS)
    assert scanned is not None
    return by_pickle, index_scanned(scanned)


def assert_same(a: SnapshotIndex, b: SnapshotIndex) -> None:
    for name, value in vars(a).items():
        if isinstance(value, np.ndarray):
            other = getattr(b, name)
            assert value.dtype == other.dtype, name
            assert np.array_equal(value, other), name
    assert a.stacks == b.stacks and a.meta == b.meta


def test_the_scanner_was_built():
    # The extension is optional so that an install without a compiler works; here, where
    # setup has gcc, its absence would silently cost the large files their speed.
    assert scan.available()


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize(
    "make",
    [
        small_snapshot,
        holed_segment_snapshot,
        shared_frames_snapshot,
        lambda: random_snapshot(5000, 3),
    ],
    ids=["small", "holed", "shared-frames", "random"],
)
def test_the_scanner_gives_the_index_that_pickle_gives(tmp_path, protocol, make):
    a, b = both(write(tmp_path / "snap.pickle", make(), protocol))
    assert_same(a, b)
    assert len(a.ev_time) > 0 or make is holed_segment_snapshot


def test_devices_times_and_unknown_actions_come_through(tmp_path):
    _, index = both(write(tmp_path / "snap.pickle", shared_frames_snapshot()))
    assert index.ev_device.tolist() == [0, 0, 0, 2, 2, 2, 2, 2]
    assert index.ev_time[:3].tolist() == [0, 1, 2]  # no times: their order, as torch 2.0
    assert index.ev_action[4] == 127 and index.ev_addr[5] == 0x7FFF_0000_0000
    block_stack = index.stacks[index.al_stack[index.al_addr == 0x1000][0]]
    assert block_stack[0] == "reset_parameters (/x/torch/nn/modules/linear.py:100)"


def test_a_file_indexed_with_the_scanner_says_so(tmp_path):
    path = write(tmp_path / "snap.pickle", small_snapshot())
    assert index_snapshot(path, tmp_path / "a.index").meta["reader"] == "scanner"
    assert index_snapshot(path, tmp_path / "b.index", native=False).meta["reader"] == "pickle"


def test_a_pickle_of_objects_is_left_to_pickle_which_names_them(tmp_path):
    from collections import OrderedDict

    path = write(tmp_path / "objects.pickle", OrderedDict(segments=[]))
    assert scan.scan_snapshot(path, ACTIONS) is None
    with pytest.raises(SnapshotError, match=r"collections\.OrderedDict"):
        index_snapshot(path, tmp_path / "x.index")


def test_every_cut_of_a_snapshot_is_a_clear_error(tmp_path):
    whole = pickle.dumps(shared_frames_snapshot(), protocol=4)
    path = tmp_path / "cut.pickle"
    for end in range(1, len(whole)):
        path.write_bytes(whole[:end])
        with pytest.raises(SnapshotError, match="truncated or damaged"):
            scan.scan_snapshot(path, ACTIONS)


def test_damaged_bytes_never_crash_the_scanner(tmp_path):
    """Random bytes overwritten: an error, the reader's fallback, or a different snapshot,
    never a crash or a read past the end (the test process would die)."""
    whole = bytearray(pickle.dumps(shared_frames_snapshot(), protocol=4))
    path = tmp_path / "damaged.pickle"
    rng = random.Random(7)
    outcomes = {"error": 0, "fallback": 0, "read": 0}
    for _ in range(3000):
        damaged = bytearray(whole)
        for _ in range(rng.randrange(1, 4)):
            damaged[rng.randrange(2, len(damaged))] = rng.randrange(256)
        path.write_bytes(damaged)
        try:
            got = scan.scan_snapshot(path, ACTIONS)
        except SnapshotError:
            outcomes["error"] += 1
        else:
            outcomes["fallback" if got is None else "read"] += 1
    assert all(outcomes.values()), outcomes  # each way out was taken


def shared_objects_snapshot() -> dict[str, Any]:
    """Every way pickle refers back to an object it wrote: one event dict twice in a trace
    and again in another, one trace list on two devices, a frames list and a frame dict
    shared by events and blocks, a stack deeper than pickle's batch of 1000 (appended in
    two), a frame dict with a key more than a frame's, and plain values met twice."""
    deep = [{"name": f"f{i}", "filename": "deep.py", "line": i} for i in range(1200)]
    odd = [{"name": "g", "filename": "odd.py", "line": 1, "column": 4}, *GRADIENT[:1]]
    twice = alloc(0x5000, MiB, 5, ACTIVATION)
    shared_trace = [alloc(0x9000, 2 * MiB, 1, PARAM), *free(0x9000, 2 * MiB, 2)]
    trace = [
        alloc(0x1000, MiB, 3, deep),
        twice,
        alloc(0x3000, MiB, 4, odd),
        twice,
        *free(0x5000, MiB, 6),
        alloc(0x6000, 3, 7, [PARAM[0], deep[5], ACTIVATION[1]]),
    ]
    seg = segment(0x1000, [(0x1000, MiB, "active_allocated"), (0x101000, MiB, "inactive")])
    seg["blocks"][0]["frames"] = ACTIVATION
    seg["blocks"][1]["frames"] = odd
    pair = (1.5, b"\x00\xff", True, None, "literal")
    return {
        "segments": [seg],
        "device_traces": [trace, shared_trace, [twice], shared_trace],
        "allocator_settings": {"a": pair, "b": pair, "c": [pair[0], pair[1], pair[4]]},
    }  # fmt: skip


@pytest.mark.parametrize("protocol", [3, 4, 5])  # 2 pickles bytes as objects
def test_objects_the_pickle_refers_back_to_are_read_as_pickle_reads_them(tmp_path, protocol):
    snapshot = shared_objects_snapshot()
    path = write(tmp_path / "snap.pickle", snapshot, protocol)
    a, b = both(path)
    assert_same(a, b)
    # Two devices share one list, and an event is in two traces: every row is there.
    assert np.bincount(b.ev_device).tolist() == [len(t) for t in snapshot["device_traces"]]
    scanned = scan.scan_snapshot(path, ACTIONS)
    assert scanned.data["segments"] == snapshot["segments"]  # the blocks' frames whole
    assert scanned.data["allocator_settings"] == snapshot["allocator_settings"]
    deep_stack = b.stacks[b.ev_stack[0]]
    assert len(deep_stack) == 1200 and deep_stack[5] == "f5 (deep.py:5)"
