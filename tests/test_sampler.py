"""The sampler reads counters at a steady rate and survives a broken backend."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from torchmem.probe.backends import (
    MemoryBackend,
    NvmlBackend,
    ProcessBackend,
    TorchAllocatorBackend,
    discover_backends,
)
from torchmem.probe.sampler import Sampler, clamp_rate


class Counting(MemoryBackend):
    kind = "test"

    def __init__(self):
        self.n = 0

    def read(self, out, full=True):
        self.n += 1
        out["test:0/allocated"] = float(self.n)


class Broken(MemoryBackend):
    kind = "broken"

    def read(self, out, full=True):
        raise RuntimeError("driver went away")


def test_samples_arrive_at_the_set_rate_without_bunching():
    times = []
    enough = threading.Event()

    def sink(sample):
        times.append(sample.t)
        if len(times) >= 40:
            enough.set()

    sampler = Sampler([Counting()], sink, hz=100)
    sampler.start()
    try:
        assert enough.wait(10), "the sampler produced fewer than 40 samples in 10 s"
    finally:
        sampler.stop()
    gaps = np.diff(times[:40])
    assert 0.007 < float(np.median(gaps)) < 0.02, f"median gap {np.median(gaps):.4f} s at 100 Hz"
    assert not sampler.running


def test_a_failing_backend_does_not_stop_the_others():
    sampler = Sampler([Broken(), Counting()], lambda s: None)
    sample = sampler.sample()
    assert sample.values == {"test:0/allocated": 1.0}


def test_rate_is_clamped_to_1_to_100_hz():
    assert clamp_rate(0.01) == 1.0
    assert clamp_rate(1000) == 100.0
    sampler = Sampler([], lambda s: None, hz=500)
    assert sampler.hz == 100.0
    sampler.set_rate(5)
    assert sampler.hz == 5.0


def test_process_backend_reads_rss_and_system_memory():
    values = {}
    ProcessBackend().read(values)
    assert values["cpu/rss"] > 10 << 20
    assert values["system/available"] > 0
    assert "cpu/uss" in values  # first read includes USS; later ones at most every 2 s
    again = {}
    ProcessBackend(uss_every_s=3600).read(again)
    assert "cpu/rss" in again


def test_accelerator_backend_reads_counters_only_once_initialised(stub_cuda):
    backend = TorchAllocatorBackend(stub_cuda, "cuda")
    stub_cuda.initialized = False
    values = {}
    backend.read(values)
    assert values == {}, "no readings (and no context creation) before the script uses CUDA"
    stub_cuda.initialized = True
    stub_cuda.alloc(0, 100 << 20)
    backend.read(values)
    assert values["cuda:0/allocated"] == 100 << 20
    assert values["cuda:0/reserved"] == (100 << 20) + (2 << 20)
    assert values["cuda:0/peak_allocated"] == 100 << 20
    # The fragmentation gauge, from memory_stats at most once a second.
    assert values["cuda:0/inactive_split"] == 2 << 20
    assert values["cuda:0/ooms"] == 0 and values["cuda:0/alloc_retries"] == 0
    # Pinned host memory, from the pinned allocator's stats, on the host's plot.
    assert values["cpu/pinned"] == 64 << 20 and values["cpu/pinned_active"] == 16 << 20
    stub_cuda.alloc(0, 10 << 20)
    values.clear()
    backend.read(values)
    assert "cuda:0/inactive_split" not in values, "memory_stats builds a large dict: 1 Hz"
    assert backend.capacity() == {"cuda:0": 80 << 30}
    assert stub_cuda.calls == [], "reading must not empty caches or reset peaks"


class StubNvml:
    """A stand-in for pynvml (its camelCase names): two GPUs; this process holds 300 MiB
    on NVML's second."""

    class NVMLError(Exception):
        pass

    uuids = ("GPU-aaaa", "GPU-bbbb")

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return self.uuids[handle]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list:
        used = 300 << 20 if handle == 1 else None
        return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=used)] if used else []

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        return SimpleNamespace(total=141 << 30)


def test_nvml_names_devices_as_torch_does_only_once_the_script_initialised_cuda(stub_cuda):
    # CUDA_VISIBLE_DEVICES=1: torch's cuda:0 is NVML's second GPU, matched by UUID.
    properties = []

    def get_device_properties(i: int) -> SimpleNamespace:
        properties.append(i)
        return SimpleNamespace(uuid="bbbb", total_memory=141 << 30)

    stub_cuda.get_device_properties = get_device_properties
    stub_cuda.initialized = False
    backend = NvmlBackend(StubNvml(), every_s=0.0, cuda=stub_cuda)
    values: dict[str, float] = {}
    backend.read(values)
    assert values == {} and backend.capacity() == {}
    # Matching UUIDs initialises CUDA in torch: before the script has, nothing may ask.
    assert properties == [], "naming the devices would have put CUDA in this process"
    stub_cuda.initialized = True
    backend.read(values)
    assert values == {"cuda:0/nvml_used": 300 << 20}
    assert backend.capacity() == {"gpu:0": 141 << 30, "cuda:0": 141 << 30}


def test_nvml_watching_another_process_names_devices_by_nvml_index():
    backend = NvmlBackend(StubNvml(), every_s=0.0)
    values: dict[str, float] = {}
    backend.read(values)
    assert values == {"gpu:1/nvml_used": 300 << 20}


def test_discovery_on_this_machine_has_host_memory():
    kinds = [b.kind for b in discover_backends()]
    assert kinds[0] == "cpu"


@pytest.mark.slow
def test_rss_comes_from_a_kept_open_statm_and_a_dead_process_still_says_so():
    import subprocess
    import sys

    import psutil
    import pytest

    backend = ProcessBackend()
    out: dict[str, float] = {}
    backend.read(out, full=False)
    assert abs(out["cpu/rss"] - psutil.Process().memory_info().rss) < 8 << 20
    ballast = bytearray(64 << 20)  # touched: RSS must follow at the next reading
    backend.read(out, full=False)
    assert out["cpu/rss"] >= psutil.Process().memory_info().rss - (8 << 20)
    del ballast
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    other = ProcessBackend(child.pid)
    child.wait()
    with pytest.raises(psutil.NoSuchProcess):
        other.read({}, full=False)


@pytest.mark.slow
def test_the_workers_memory_is_what_they_hold_alone_and_helpers_are_not_workers():
    """Forked workers (as a DataLoader's) are read as the sum of their USS: the 40 MiB
    each one writes count, the parent's pages they share do not. A process torchmem
    started (here one whose command line names torchmem) is not a worker."""
    import multiprocessing
    import subprocess
    import sys

    from torchmem.probe.workers import workers_memory

    base_count, base_uss = workers_memory()  # pytest-xvfb's Xvfb, for one
    ballast = bytearray(200 << 20)  # the parent's pages: shared with forks, not theirs
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Barrier(3), ctx.Event()

    def worker() -> None:
        own = bytearray(40 << 20)  # written: pages of its own
        ready.wait()
        done.wait(60)
        del own

    workers = [ctx.Process(target=worker) for _ in range(2)]
    helper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)  # torchmem.lab.worker"]
    )
    try:
        for w in workers:
            w.start()
        ready.wait(60)
        count, uss = workers_memory()
        assert count == base_count + 2  # the two forks; not the helper
        assert 80 << 20 <= uss - base_uss < 150 << 20, uss  # not 2 x 200 MiB of ballast
    finally:
        done.set()
        for w in workers:
            w.join(30)
        helper.kill()
        helper.wait()
    assert workers_memory()[0] == base_count
    del ballast


def test_the_child_processes_series_reads_zero_once_when_they_are_gone(monkeypatch):
    from torchmem.probe import backends

    found = iter([(0, 0), (2, 90 << 20), (0, 0), (0, 0)])
    monkeypatch.setattr(backends, "workers_memory", lambda pid: next(found))
    backend = backends.ProcessBackend(uss_every_s=0)
    readings = []
    for _ in range(4):
        out: dict[str, float] = {}
        backend.read(out, full=True)
        readings.append(out.get("cpu/children"))
    assert readings == [None, 90 << 20, 0.0, None]


def test_a_burst_between_two_samples_is_the_rss_peak_from_the_kernel():
    from torchmem.events import Sample
    from torchmem.probe.backends import reset_peak_rss
    from torchmem.session import Session

    backend = ProcessBackend()
    assert reset_peak_rss(), "Linux 4.0 or later resets VmHWM"
    before: dict[str, float] = {}
    backend.read(before)
    burst = b"\x01" * (200 << 20)  # written, so resident: 200 MiB between two samples
    del burst
    after: dict[str, float] = {}
    backend.read(after)
    MiB = 1 << 20
    assert after["cpu/rss_peak"] >= before["cpu/rss"] + 190 * MiB
    assert after["cpu/rss"] < before["cpu/rss"] + 100 * MiB, "the burst was given back"
    session = Session()
    session.submit(Sample(0.0, before))
    session.submit(Sample(0.1, after))
    sampled = max(before["cpu/rss"], after["cpu/rss"])
    assert session.latest()["cpu/rss"][1] == after["cpu/rss_peak"] > sampled
    assert session.kernel_peaks() == {"cpu/rss": after["cpu/rss_peak"]}
    assert session.peak_bytes()["cpu_rss"] == after["cpu/rss_peak"]
    # A job's total is a sum of processes: the sum of their peaks is not its peak.
    session.submit(Sample(0.2, {"total/cpu/rss": 1.0, "total/cpu/rss_peak": 5.0}))
    assert session.latest()["total/cpu/rss"][1] == 1.0


@pytest.mark.slow
@pytest.mark.parametrize("collector", ["enabled", "disabled"])
def test_torch_and_the_first_optimizer_leave_the_scripts_garbage_collector_as_it_was(collector):
    # torchmem imports torch, and lets the script import torch._dynamo (its first
    # optimizer does), with the collector paused: they start sooner. A script whose
    # collector came back disabled would keep every cycle it makes.
    code = (
        "import gc, sys\n"
        "from torchmem.probe.backends import discover_backends\n"
        "from torchmem.probe.torch_import import pause_collector_for_lazy_imports\n"
        "if sys.argv[1] == 'disabled': gc.disable()\n"
        "pause_collector_for_lazy_imports()\n"
        "discover_backends()\n"
        "assert 'torch' in sys.modules and 'torch._dynamo' not in sys.modules\n"
        "print('enabled' if gc.isenabled() else 'disabled')\n"
        "import torch\n"
        "model = torch.nn.Linear(4, 1)\n"
        "before = model.weight.detach().clone()\n"
        "optimizer = torch.optim.Adam(model.parameters(), lr=0.1)\n"
        "model(torch.ones(2, 4)).sum().backward()\n"
        "optimizer.step()\n"
        "assert 'torch._dynamo' in sys.modules and not torch.equal(before, model.weight)\n"
        "print('enabled' if gc.isenabled() else 'disabled')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, collector], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [collector, collector]
