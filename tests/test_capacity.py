"""A device's total memory is one fact of the Session, reported by the run's source when
the run starts using the device: the Readings' share, the leak detector's capacity alerts,
the OOM report and a recording's summary all read that one copy. Never run on a GPU here:
the CUDA runtime is the stub of conftest."""

from __future__ import annotations

import threading
import time

from torchmem.probe.backends import ProcessBackend, TorchAllocatorBackend
from torchmem.session import Session
from torchmem.sources.base import Script
from torchmem.sources.inprocess import InProcessSource


def wait_for(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_device_the_run_starts_using_late_is_reported_with_its_total(stub_cuda, tmp_path):
    session = Session()
    stub_cuda.initialized = False  # the script has not touched CUDA yet
    source = InProcessSource(
        session, backends=[ProcessBackend(), TorchAllocatorBackend(stub_cuda, "cuda")], hz=50
    )
    script, done = tmp_path / "waits.py", tmp_path / "done"
    script.write_text(
        "import pathlib, sys, time\n"
        "while not pathlib.Path(sys.argv[1]).exists():\n"
        "    time.sleep(0.01)\n"
    )
    run = threading.Thread(target=source.run_script, args=(Script(script, (str(done),)),))
    run.start()
    try:
        wait_for(lambda: "cpu" in session.capacity())
        assert "cuda:0" not in session.capacity()
        stub_cuda.initialized = True  # its first tensor on the device
        stub_cuda.alloc(0, 1 << 30)
        wait_for(lambda: "cuda:0" in session.capacity())
        assert session.capacity()["cuda:0"] == 80 << 30
        # The leak detector judges capacity alerts against the same total.
        assert source.leaks.capacity["cuda:0"] == 80 << 30
    finally:
        done.touch()
        run.join(10)
        source.close()
