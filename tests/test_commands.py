"""gc.collect, empty_cache and reset peaks each say what they changed."""

from __future__ import annotations

import gc
import os
import pickle
import re
from pathlib import Path

from torchmem.probe.backends import ProcessBackend, TorchAllocatorBackend
from torchmem.probe.commands import (
    allocation_history,
    empty_cache,
    gc_collect,
    reset_peaks,
    save_snapshot,
)
from torchmem.session import Session
from torchmem.sources.inprocess import InProcessSource


def now():
    return 1.0


def _make_cycles(n):
    for _ in range(n):
        a, b = [], []
        a.append(b)
        b.append(a)


def test_gc_collect_counts_objects_and_reports_rss():
    gc.collect()
    gc.disable()  # so that the automatic collector does not take the cycles first
    try:
        _make_cycles(500)
        result = gc_collect([ProcessBackend()], now)
    finally:
        gc.enable()
    assert result.ok
    assert result.changes["collected"] >= 1000
    assert re.match(
        r"gc\.collect: [\d,]+ objects collected in \d+ ms \(then malloc_trim\), RSS [+-]?",
        result.message,
    )


def test_empty_cache_reports_what_was_released(stub_cuda):
    stub_cuda.alloc(0, 300 << 20)
    stub_cuda.free(0, 200 << 20)  # the allocator keeps the freed blocks cached
    backend = TorchAllocatorBackend(stub_cuda, "cuda")
    result = empty_cache([ProcessBackend(), backend], now)
    assert stub_cuda.calls == ["empty_cache"]
    assert result.changes["cuda:0/reserved"] == -(202 << 20)
    assert result.message == "empty_cache: cuda:0 reserved -202.0 MiB (now 100.0 MiB)"


def test_empty_cache_without_accelerator_says_so():
    result = empty_cache([ProcessBackend()], now)
    assert not result.ok
    assert "no accelerator" in result.message


def test_reset_peaks_names_old_and_new_peaks(stub_cuda):
    stub_cuda.alloc(0, 1 << 30)
    stub_cuda.free(0, 768 << 20)
    backend = TorchAllocatorBackend(stub_cuda, "cuda")
    result = reset_peaks([backend], now, {"cpu/rss": 900 << 20})
    assert "cuda:0 peak allocated 1.00 GiB -> 256.0 MiB" in result.message
    assert stub_cuda.calls == ["reset_peak_memory_stats(0)"]


def test_session_forgets_its_peaks_when_told(stub_cuda):
    session = Session()
    source = InProcessSource(session, [ProcessBackend(), TorchAllocatorBackend(stub_cuda, "cuda")])
    stub_cuda.alloc(0, 512 << 20)
    source.sampler.sample()
    stub_cuda.free(0, 500 << 20)
    source.sampler.sample()
    assert session.latest()["cuda:0/allocated"][1] == 512 << 20
    (result,) = source.command("reset_peaks")
    assert result.ok and session.commands[-1] is result
    assert session.latest()["cuda:0/allocated"][1] == 12 << 20
    assert source.command("bogus")[0].ok is False


def test_allocation_history_starts_stops_and_a_snapshot_lands_in_the_folder(
    stub_cuda, tmp_path, monkeypatch
):
    monkeypatch.setenv("TORCHMEM_SNAPSHOT_DIR", str(tmp_path / "snaps"))
    session = Session()
    source = InProcessSource(session, [ProcessBackend(), TorchAllocatorBackend(stub_cuda, "cuda")])
    (started,) = source.command("history_start")
    assert started.ok and "100,000 events" in started.message
    assert stub_cuda.memory.recording == 100_000
    (snap,) = source.command("snapshot")
    assert snap.ok and session.commands[-1] is snap
    path = Path(snap.output)
    assert path.parent == tmp_path / "snaps" and path.name.startswith(f"snapshot-{os.getpid()}-")
    assert (path.parent.stat().st_mode & 0o777) == 0o700  # stacks can name private code
    with path.open("rb") as f:
        assert pickle.load(f)["device_traces"] == [[{"action": "alloc"}]]
    assert str(path) in snap.message and "memory_viz" in snap.message
    (stopped,) = source.command("history_stop")
    assert stopped.ok and stub_cuda.memory.recording is None
    assert stub_cuda.calls[-1] == "record_history(None, 1)"


def test_allocation_history_is_refused_where_cuda_is_not_in_use(stub_cuda, tmp_path):
    assert not allocation_history([ProcessBackend()], now, record=True).ok
    stub_cuda.initialized = False  # recording would create a CUDA context of its own
    result = allocation_history([TorchAllocatorBackend(stub_cuda, "cuda")], now, record=True)
    assert not result.ok and "has not used CUDA" in result.message
    assert stub_cuda.memory.recording is None
    snap = save_snapshot([TorchAllocatorBackend(stub_cuda, "cuda")], now, tmp_path)
    assert not snap.ok and snap.output == "" and not list(tmp_path.iterdir())


def test_a_snapshot_that_cannot_be_written_says_where_and_why(stub_cuda, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = save_snapshot([TorchAllocatorBackend(stub_cuda, "cuda")], now, blocker / "snaps")
    assert not result.ok
    assert result.message.startswith(f"cannot write a snapshot in {blocker / 'snaps'}")


def test_a_census_that_fails_is_a_failed_command_with_its_reason():
    import torch

    class Broken(torch.nn.Module):
        def children(self):
            raise RuntimeError("children() of a broken module")

    broken = Broken()
    session = Session()
    source = InProcessSource(session, [ProcessBackend()])
    (result,) = source.command("census")
    assert not result.ok
    assert result.message == "the census failed: RuntimeError: children() of a broken module"
    del broken
    (result,) = source.command("census")
    latest, _ = session.censuses()
    assert result.ok and latest is not None and latest.trigger == "user"
