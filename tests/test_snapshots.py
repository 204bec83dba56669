"""Memory snapshots: read safely, indexed, and the peak and live set equal a replay."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections import OrderedDict

import numpy as np
import pytest
from snapshot_files import MiB, random_snapshot, replay, small_snapshot, write

from torchmem.cli.snapshot import snapshot_info
from torchmem.snapshots import analysis
from torchmem.snapshots.index import build_index
from torchmem.snapshots.open import index_path, open_snapshot
from torchmem.snapshots.read import SnapshotError, read_snapshot

# Starts torchmem, agent or training processes (conftest checks the mark).
pytestmark = pytest.mark.slow


def snapshot_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchmem", "snapshot", "info", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_small_snapshot_gives_the_figures_computed_by_hand():
    index = build_index(small_snapshot())
    line = analysis.timeline(index, 0)
    assert line.initial == 3 * MiB // 2  # A (freed in the trace) and F (never mentioned)
    steps = [v / MiB for v, a in zip(line.active, index.ev_action, strict=True) if a in (0, 2)]
    assert steps == [3.5, 7.5, 10.5, 6.5, 5.5, 13.5, 5.5]
    peak, when, event = line.peak
    assert (peak, when) == (27 * MiB // 2, 6)
    live = analysis.live_at(index, 0, event)
    assert sorted(int(index.al_size[r]) for r in live) == [MiB // 2, 2 * MiB, 3 * MiB, 8 * MiB]
    groups = analysis.by_owner(index, live)
    assert [(g.frame, g.bytes, g.category) for g in groups[:3]] == [
        ("main (train.py:50)", 8 * MiB, "gradient"),
        ("main (train.py:40)", 3 * MiB, "optimizer state"),
        ("main (train.py:10)", 2 * MiB, "parameter"),
    ]
    assert analysis.by_category(index, live)["activation"] == 0  # C was freed before
    seg = analysis.segments(index, 0)
    assert (seg.segments, seg.reserved, seg.allocated) == (3, 8 * MiB, 11 * MiB // 2)
    assert seg.inactive_split == 5 * MiB // 2  # the free halves of two split segments


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_peak_and_the_live_set_equal_an_independent_replay(seed):
    snapshot = random_snapshot(20_000, seed)
    best, when, at_peak = replay(snapshot)
    index = build_index(snapshot)
    peak, t, event = analysis.timeline(index, 0).peak
    assert (peak, t) == (best, when)
    live = analysis.live_at(index, 0, event)
    assert {int(a) for a in index.al_addr[live]} == at_peak


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_every_pickle_protocol_opens_and_the_index_is_reused(tmp_path, protocol):
    path = write(tmp_path / "snap.pickle", small_snapshot(), protocol)
    seen: list[float] = []
    index = open_snapshot(path, seen.append)
    assert seen and seen[-1] == pytest.approx(1.0) and seen == sorted(seen)
    assert index_path(path).exists()
    again = open_snapshot(path, isolated=False)  # from the index: nothing read again
    assert np.array_equal(again.ev_time, index.ev_time) and again.stacks == index.stacks


def test_a_changed_snapshot_replaces_its_old_index_and_leftovers_go(tmp_path):
    # An index is named by the file's size and time: without this, every change of a
    # snapshot (written again at the same path) would leave half a GiB behind at 10 M
    # events, and the zips of earlier versions would stay forever.
    path = write(tmp_path / "snap.pickle", random_snapshot(2_000, 3))
    twin = tmp_path / "elsewhere"
    twin.mkdir()
    twin_path = write(twin / "snap.pickle", small_snapshot())  # same name, another file
    open_snapshot(path, isolated=False)
    open_snapshot(twin_path, isolated=False)
    old, kept = index_path(path), index_path(twin_path)
    folder = old.parent
    (folder / f"snap-{'0' * 16}.npz").write_bytes(b"PK")  # a version 1 index
    (folder / f"{old.name}.tmp999999999").mkdir()  # a save whose process died
    (folder / f"{old.name}.tmp{os.getpid()}").mkdir()  # a save still going on
    write(path, random_snapshot(3_000, 4))
    os.utime(path, ns=(1, 1))  # another time, whatever the clock's resolution
    index = open_snapshot(path, isolated=False)
    assert index.meta["events"] > 2_000
    assert index_path(path).is_dir() and not old.exists()
    assert kept.is_dir()  # the other file's index stays
    left = sorted(p.name for p in folder.iterdir())
    assert left == sorted([index_path(path).name, kept.name, f"{old.name}.tmp{os.getpid()}"])


@pytest.mark.parametrize("damage", ["cut array", "bad facts", "no facts"])
def test_a_damaged_saved_index_is_built_again_with_the_same_figures(tmp_path, damage):
    path = write(tmp_path / "snap.pickle", random_snapshot(2_000, 3))
    first = open_snapshot(path, isolated=False)
    peak = analysis.timeline(first, 0).peak
    folder = index_path(path)
    if damage == "cut array":
        array = folder / "ev_time.npy"
        array.write_bytes(array.read_bytes()[:100])
    elif damage == "bad facts":
        (folder / "extra.json").write_text("{not json")
    else:
        (folder / "extra.json").unlink()
    again = open_snapshot(path, isolated=False)
    assert analysis.timeline(again, 0).peak == peak
    assert np.array_equal(again.ev_time, first.ev_time)
    # Saved whole again: the next open reads the index, whose arrays map its files.
    reopened = open_snapshot(path, isolated=False)
    assert np.array_equal(reopened.al_size, first.al_size)
    assert not reopened.ev_time.flags.writeable


def test_the_command_line_prints_the_peak_and_its_owners(tmp_path):
    path = write(tmp_path / "snap.pickle", small_snapshot())
    r = snapshot_cli("--json", str(path))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["peak_active_bytes"] == 27 * MiB // 2 and data["peak_time_us"] == 6
    assert data["events"] == 10 and data["segments"] == 3
    assert data["top_stacks"][0]["frame"] == "main (train.py:50)"
    text = snapshot_cli(str(path))
    assert text.returncode == 0 and "peak active 13.50 MiB" in text.stdout
    assert "gradient" in text.stdout and "main (train.py:40)" in text.stdout


def test_the_info_matches_what_the_index_says():
    data = snapshot_info(build_index(small_snapshot()))
    assert data["devices"][0]["by_category"]["optimizer state"] == 3 * MiB


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "is empty"),
        (b"hello, not a pickle", "not a pickle"),
        (pickle.dumps(small_snapshot())[:200], "truncated or damaged"),
        (pickle.dumps({"state_dict": {}}), "not a memory snapshot"),
        (pickle.dumps([1, 2, 3]), "a list of int, not a memory snapshot"),
        (pickle.dumps(OrderedDict(a=1)), "holds Python objects (collections.OrderedDict)"),
    ],
)
def test_a_file_that_is_not_a_snapshot_is_one_clear_line(tmp_path, content, message):
    path = tmp_path / "bad.pickle"
    path.write_bytes(content)
    with pytest.raises(SnapshotError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_snapshot(path)
    r = snapshot_cli(str(path))
    assert r.returncode == 1 and message in r.stderr and "Traceback" not in r.stderr


def test_a_missing_file_is_said_so(tmp_path):
    r = snapshot_cli(str(tmp_path / "nowhere.pickle"))
    assert r.returncode == 1 and "No such file" in r.stderr


def test_the_stacked_timeline_adds_up_and_keeps_the_peak_when_thinned():
    index = build_index(random_snapshot(30_000, 4))
    line = analysis.timeline(index, 0)
    t, curves, rows = analysis.category_curves(index, 0, max_points=800)
    total = sum(curves.values())
    assert len(t) <= 1000 and total.max() == line.active.max()
    assert np.array_equal(total, line.active[np.searchsorted(line.events, rows)])
    small = build_index(small_snapshot())
    _, curves, _ = analysis.category_curves(small, 0)
    assert curves["gradient"].max() == 8 * MiB and curves["activation"][-1] == 0


def test_a_stretch_is_thinned_again_on_its_own_with_every_category_exact():
    # What a zoom draws: any stretch of the trace, thinned to its own points, each
    # category's bytes there equal to its running sum over every event before.
    index = build_index(random_snapshot(30_000, 4))
    stacked = analysis.stacked_curves(index, 0, max_points=800)
    line = stacked.line
    delta = np.diff(line.active, prepend=line.initial)
    whole_rows = stacked.whole()[2]
    first = np.searchsorted(line.events, whole_rows[0])
    exact = {}
    for i, c in enumerate(analysis.CATEGORIES):
        mine = np.cumsum(np.where(stacked.codes == i, delta, 0))
        exact[c] = stacked.totals[c][0] - mine[first] + mine  # the same start as the whole
    rng = np.random.default_rng(2)
    n = len(line.active)
    widths = rng.choice([1, 50, 799, 5000, n], 40)
    cases = [(0, 0), (n - 1, 5), (17, 300), *zip(rng.integers(0, n, 40), widths, strict=True)]
    for lo, width in cases:
        hi = min(n - 1, int(lo + width))
        _, curves, rows = stacked.between(int(lo), hi, max_points=800)
        at = np.searchsorted(line.events, rows)
        assert at[0] == lo and at[-1] == hi and len(at) <= 1000
        for c in analysis.CATEGORIES:
            assert np.array_equal(curves[c], exact[c][at]), (lo, hi, c)
        total = sum(curves.values())
        assert np.array_equal(total, line.active[at])
        assert total.max() == line.active[lo : hi + 1].max()  # the stretch's own peak
    # 300 events: every one of them drawn, where the whole trace had a few.
    _, _, rows = stacked.between(17, 316, max_points=800)
    assert (
        len(rows) == 300
        and np.count_nonzero((whole_rows >= rows[0]) & (whole_rows <= rows[-1])) < 30
    )


def test_two_snapshots_compare_by_line_at_their_peaks(tmp_path):
    from snapshot_files import GRADIENT, alloc, frames, free

    before = small_snapshot()
    after = small_snapshot()
    trace = after["device_traces"][0]
    for event in trace:
        if event["size"] == 8 * MiB:  # the gradient doubled (a bigger batch)
            event["size"] = 16 * MiB
    extra = frames("forward@new_head.py:7", "main@train.py:31")
    trace[-2:-2] = [alloc(0x900000, 2 * MiB, 6, extra)]  # a new line, live at the peak
    trace += free(0x900000, 2 * MiB, 8)
    a = write(tmp_path / "before.pickle", before)
    b = write(tmp_path / "after.pickle", after)
    index_a, index_b = build_index(before), build_index(after)
    peak_a, peak_b, diffs = analysis.compare_peaks(index_a, index_b)
    assert (peak_a, peak_b) == (27 * MiB // 2, 27 * MiB // 2 + 10 * MiB)
    changes = {d.frame: d.change for d in diffs}
    assert (
        changes["main (train.py:50)"] == 8 * MiB and changes["forward (new_head.py:7)"] == 2 * MiB
    )
    assert changes["main (train.py:40)"] == 0 and diffs[0].frame == "main (train.py:50)"
    assert GRADIENT  # the helper's stack of the gradient, whose size changed
    r = subprocess.run(
        [sys.executable, "-m", "torchmem", "snapshot", "diff", "--json", str(a), str(b)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["peak_change_bytes"] == 10 * MiB
    assert data["owners"][0]["frame"] == "main (train.py:50)"
    text = subprocess.run(
        [sys.executable, "-m", "torchmem", "snapshot", "diff", str(a), str(b)],
        capture_output=True, text=True, timeout=120,
    ).stdout  # fmt: skip
    assert "13.50 MiB -> 23.50 MiB (+10.00 MiB)" in text and "(only after)" in text


def test_the_allocator_state_at_a_moment_shows_the_largest_free_block():
    from snapshot_files import holed_segment_snapshot

    snapshot = holed_segment_snapshot()
    index = build_index(snapshot)
    rows = {int(index.ev_time[r]): r for r in range(len(index.ev_time))}
    (at_4,) = analysis.segments_at(index, 0, rows[4])
    assert (at_4.size, at_4.allocated, at_4.largest_free) == (20 * MiB, 16 * MiB, 4 * MiB)
    (at_5,) = analysis.segments_at(index, 0, max(r for r in rows.values()))
    assert (at_5.allocated, at_5.largest_free) == (8 * MiB, 8 * MiB)  # the hole, not the tail
    # Block by block, for the map: what is where in the segment, and what it is.
    assert at_5.blocks == ((0, 4 * MiB, "parameter"), (12 * MiB, 4 * MiB, "parameter"))
    assert len(at_4.blocks) == 3
    assert analysis.segments_at(index, 0, -1) == []  # before the segment existed
    assert analysis.traces_segments(index, 0)
    assert not analysis.traces_segments(build_index(small_snapshot()), 0)
