"""Tensor names on a snapshot's allocations: written beside the snapshot from the run's
censuses, matched by address at a moment both were live, shown by the CLI and the window."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from snapshot_files import ACTIVATION, GRADIENT, PARAM, MiB, alloc, frames, free, segment, write

from torchmem.events import CensusTaken
from torchmem.probe.backends import ProcessBackend, TorchAllocatorBackend
from torchmem.probe.commands import names_path
from torchmem.session import Session
from torchmem.snapshots import analysis
from torchmem.snapshots.index import build_index
from torchmem.snapshots.names import match_names
from torchmem.snapshots.open import open_snapshot
from torchmem.sources.inprocess import InProcessSource
from torchmem.tensors.model import Census, StorageInfo, TensorInfo

T0 = 1_700_000_000_000_000  # trace times are Unix µs
UNNAMED = frames("main@train.py:70")  # a stack that says nothing of what it holds


def reused_address_snapshot() -> dict:
    """A parameter at 0x1000 all along; an activation at 0x2000 freed at +30 µs, then a
    gradient at the same address from +40; an allocation whose stack tells nothing."""
    trace = [
        alloc(0x1000, 4 * MiB, T0 + 10, PARAM),
        alloc(0x2000, 2 * MiB, T0 + 20, ACTIVATION),
        *free(0x2000, 2 * MiB, T0 + 30),
        alloc(0x2000, 2 * MiB, T0 + 40, GRADIENT),
        alloc(0x9000, 8 * MiB, T0 + 42, UNNAMED),
    ]
    return {"segments": [], "device_traces": [trace]}


def census(at_us: int, step: int, *storages: tuple) -> dict:
    return {"unix_us": at_us, "step": step, "storages": [list(s) for s in storages]}


CENSUSES = [
    census(T0 + 25, 3, ("cuda:0", 0x1000, 4 * MiB, "model.fc.weight", "parameter"),
           ("cuda:0", 0x2000, 2 * MiB, "hidden", "activation"),
           ("cuda:1", 0x1000, 4 * MiB, "elsewhere", "parameter")),  # another device
    census(T0 + 45, 4, ("cuda:0", 0x1000, 4 * MiB, "model.fc.weight", "parameter"),
           ("cuda:0", 0x2000, 2 * MiB, "model.fc.weight.grad", "gradient"),
           ("cuda:0", 0x9000, 8 * MiB, "optimizer.state[model.fc.weight]['exp_avg']",
            "optimizer_state")),
]  # fmt: skip


def test_an_address_gets_the_name_of_the_tensor_live_there_at_the_census():
    index = build_index(reused_address_snapshot())
    names = match_names(index, CENSUSES)
    by_address = {}
    for row, name in names.items():
        by_address.setdefault(int(index.al_addr[row]), []).append((int(index.al_start[row]), name))
    assert [n.name for _, n in by_address[0x1000]] == ["model.fc.weight"]
    # The same address, two tensors: each allocation named by the census of its lifetime.
    assert [n.name for _, n in sorted(by_address[0x2000])] == ["hidden", "model.fc.weight.grad"]
    assert len(names) == 4  # nothing from cuda:1 on device 0


def test_a_census_kind_beats_the_stacks_guess():
    index = build_index(reused_address_snapshot())
    live = analysis.live_at(index, 0, len(index.ev_time) - 1)
    guessed = analysis.by_category(index, live)
    assert guessed["optimizer state"] == 0 and guessed["other"] == 8 * MiB
    index.tensor_names = match_names(index, CENSUSES)
    named = analysis.by_category(index, live)
    assert named["optimizer state"] == 8 * MiB and named["other"] == 0
    groups = {g.frame: g for g in analysis.by_owner(index, live)}
    assert groups["main (train.py:70)"].category == "optimizer state"
    assert groups["main (train.py:50)"].tensors == ("model.fc.weight.grad",)
    _, curves, _ = analysis.category_curves(index, 0)
    assert curves["optimizer state"][-1] == 8 * MiB  # the timeline colours it too


def snapshot_with_names(tmp_path: Path, sidecar: str | None) -> Path:
    path = write(tmp_path / "snap.pickle", reused_address_snapshot())
    if sidecar is not None:
        names_path(path).write_text(sidecar)
    return path


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchmem", "snapshot", "info", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.slow
def test_the_command_line_names_the_tensors_of_each_line(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHMEM_SESSIONS_DIR", str(tmp_path / "sessions"))
    path = snapshot_with_names(tmp_path, json.dumps({"version": 1, "censuses": CENSUSES}))
    r = cli("--json", str(path))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["named_allocations"] == 4  # both tenants of 0x2000 among them
    tensors = {g["frame"]: g["tensors"] for g in data["top_stacks"]}
    assert tensors["main (train.py:10)"] == ["model.fc.weight"]
    text = cli(str(path)).stdout
    assert "tensors: model.fc.weight.grad" in text and "optimizer state" in text


@pytest.mark.slow
def test_a_damaged_names_file_is_a_note_not_a_failure(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHMEM_SESSIONS_DIR", str(tmp_path / "sessions"))
    path = snapshot_with_names(tmp_path, '{"version": 1, "censuses": [{"unix')
    r = cli(str(path))
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert "note: the tensor names beside it (snap.names.json) could not be read" in r.stdout
    index = open_snapshot(path, isolated=False)
    assert index.tensor_names == {} and "could not be read" in index.meta["names_note"]
    names_path(path).write_text(json.dumps({"censuses": [census(T0 + 45, 1, ("cuda:0", 1))]}))
    index = open_snapshot(path, isolated=False)  # a row of the wrong shape
    assert index.tensor_names == {} and "could not be read" in index.meta["names_note"]


def test_a_snapshot_saved_by_torchmem_carries_the_censuses_names(stub_cuda, tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHMEM_SNAPSHOT_DIR", str(tmp_path / "snaps"))
    session = Session()
    source = InProcessSource(session, [ProcessBackend(), TorchAllocatorBackend(stub_cuda, "cuda")])

    def storage(device: str, ptr: int, nbytes: int, name: str) -> StorageInfo:
        tensor = TensorInfo(
            name, "parameter", (nbytes // 4,), (1,), 0, "float32", device, nbytes // 4, 4,
            nbytes, False, True, True, True, "", False, (device, ptr),
        )  # fmt: skip
        return StorageInfo((device, ptr), nbytes, [tensor])

    storages = {
        ("cuda:0", 0x7F00_0000_0000): storage("cuda:0", 0x7F00_0000_0000, 4 * MiB, "model.w"),
        ("cpu", 0x1234): storage("cpu", 0x1234, MiB, "x"),  # not in a CUDA snapshot
    }
    session.submit(CensusTaken(session.now(), 7, Census(storages, [], 0.01, 7), "step"))
    source.command("history_start")
    (snap,) = source.command("snapshot")
    assert snap.ok and "the names of 1 tensors" in snap.message
    saved = json.loads(names_path(snap.output).read_text())
    (only,) = saved["censuses"]
    assert only["step"] == 7
    assert only["storages"] == [["cuda:0", 0x7F00_0000_0000, 4 * MiB, "model.w", "parameter"]]
    assert abs(only["unix_us"] / 1e6 - __import__("time").time()) < 60


def test_the_window_shows_the_names_column_only_when_there_are_names(qtbot, tmp_path):
    from torchmem.gui.windows.snapshot_window import COLUMNS, SnapshotWindow

    index = build_index(reused_address_snapshot())
    plain = SnapshotWindow(index)
    qtbot.addWidget(plain)
    assert plain.table.isColumnHidden(len(COLUMNS) - 1)
    named_index = build_index(reused_address_snapshot())
    named_index.tensor_names = match_names(named_index, CENSUSES)
    window = SnapshotWindow(named_index)
    qtbot.addWidget(window)
    window.set_moment(len(named_index.ev_time) - 1)
    column = len(COLUMNS) - 1
    assert not window.table.isColumnHidden(column)
    rows = {window.table.item(r, 0).text(): window.table.item(r, column).text()
            for r in range(window.table.rowCount())}  # fmt: skip
    assert rows["main (train.py:70)"] == "optimizer.state[model.fc.weight]['exp_avg']"
    window.table.selectRow(0)
    assert window.stack_view.toPlainText().startswith("Tensors: ")
    assert "allocations named by the run's censuses" in window.facts.text()
    assert np.all(named_index.al_size > 0)


def test_blocks_of_a_snapshot_without_a_trace_are_named_too():
    """A snapshot taken with history off has segments and blocks, no events: what a
    census found at a block's address names it."""
    snapshot = {
        "segments": [segment(0x1000, [(0x1000, 4 * MiB, "active_allocated")])],
        "device_traces": [[]],
    }
    index = build_index(snapshot)
    names = match_names(index, CENSUSES[:1])
    assert [n.name for n in names.values()] == ["model.fc.weight"]
