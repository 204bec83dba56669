"""Shared fixtures: offscreen Qt, private settings, a stub accelerator, thread hygiene."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import tempfile
import threading
import traceback
from pathlib import Path
from types import SimpleNamespace
from weakref import WeakKeyDictionary

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Keep the user's real settings out of the tests.
os.environ["XDG_CONFIG_HOME"] = tempfile.mkdtemp(prefix="torchmem-test-config-")

# Tests stop runs with Ctrl+C, as a user would. A test run started in the background of a
# non-interactive shell (`.ci/run &`, nohup) has SIGINT ignored, and children inherit an
# ignored signal through exec: every Ctrl+C then went unheard and each stop waited out its
# 60 s grace. A handler (not an ignore) is reset to the default in a child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SCRIPTS = Path(__file__).parent / "scripts"
ROOT = Path(__file__).resolve().parent.parent


#: The modules that take longest on a 2-core runner (clean-clone CI's durations: each
#: runs one torch process after another), heaviest first. The test workers take whole
#: modules (``--dist loadscope``) in collection order; started last, these left one
#: worker running for two minutes after the other had finished (717 s; 638 s with these
#: first, by a replay of that run's module times).
FIRST = (
    "test_tune_cli", "test_tune_trust", "test_tools_smoke", "test_torchrun", "test_tune_gui",
    "test_tune_job", "test_attach_gui", "test_leak_corpus", "test_ssh", "test_gui",
    "test_tune_api", "test_tune_predict_trainers", "test_agent",
)  # fmt: skip


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the longest modules first (:data:`FIRST`), the others in the order found: the
    workers then finish together. (``run-tests.sh`` turns off xdist's own order, by the
    number of tests.)"""
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(FIRST)))


@pytest.fixture
def script_path():
    """Path of a test script in tests/scripts by name."""
    return lambda name: str(SCRIPTS / name)


@pytest.fixture(autouse=True)
def _private_sessions(tmp_path_factory, monkeypatch):
    """Recorded sessions of the tests (the window records every run) go to a folder of
    their own, never to the user's."""
    monkeypatch.setenv("TORCHMEM_SESSIONS_DIR", str(tmp_path_factory.mktemp("sessions")))


#: Commands that libraries run to learn about the system, not the test's own processes.
INTROSPECTION = frozenset({"uname", "ldconfig", "gcc", "cc", "ld", "objdump", "lsb_release"})


@pytest.fixture(autouse=True)
def _slow_marker_is_true(request, monkeypatch):
    """Fail a test that starts a process without the ``slow`` mark, so that
    ``pytest -m "not slow"`` stays the fast loop it says it is (every child process the
    app starts goes through :class:`subprocess.Popen`)."""
    import subprocess

    started: list[str] = []
    base = subprocess.Popen._execute_child

    def execute_child(self, args, *rest, **kwargs):
        argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
        # Libraries asking the system about itself once (platform's `uname -p`, ctypes'
        # `ldconfig -p`) are not processes of the test's: whichever test asks first would
        # otherwise need the mark.
        if Path(str(argv[0]).split()[0]).name not in INTROSPECTION:
            started.append(" ".join(map(str, argv))[:120])
        return base(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "_execute_child", execute_child)
    yield
    if started and request.node.get_closest_marker("slow") is None:
        pytest.fail(f"starts a process ({started[0]!r}) but is not marked slow", pytrace=False)


@pytest.fixture(autouse=True)
def _no_dangling_threads(request, monkeypatch):
    """Fail any test that leaves a QThread or a torchmem thread running."""
    started: WeakKeyDictionary = WeakKeyDictionary()
    if "PySide6" in sys.modules or "qtbot" in request.fixturenames:
        from PySide6.QtCore import QThread

        base_start = QThread.start

        def start(self, *args):
            started[self] = "".join(traceback.format_stack(limit=6)[:-1])
            base_start(self, *args)

        monkeypatch.setattr(QThread, "start", start)
    yield
    if "qtbot" in request.fixturenames:
        # Widgets of this test that are garbage in reference cycles must be collected here,
        # in the GUI thread: collected later by a gc.collect() in a worker thread (the
        # gc.collect button, a census), PySide6 deadlocks destroying them there.
        import gc

        from torchmem.gui.gui_gc import GuiThreadCollector

        gc.collect()
        assert not GuiThreadCollector.active(), "a window was left open (gc stays pinned)"
        assert gc.isenabled(), "automatic garbage collection was not given back"
    dangling = []
    for thread, where in list(started.items()):
        try:
            if thread.isRunning():
                dangling.append(f"QThread {thread.objectName()!r} started at:\n{where}")
        except RuntimeError:  # the C++ object is gone: not running
            pass
    dangling += [
        f"thread {t.name!r}"
        for t in threading.enumerate()
        if t.name.startswith("torchmem") and t.is_alive()
    ]
    assert not dangling, "threads left running:\n" + "\n".join(dangling)


class StubCuda:
    """A stand-in for ``torch.cuda`` with a caching allocator we control."""

    def __init__(self, devices: int = 1, total: int = 80 << 30) -> None:
        self.initialized = True
        self.allocated = [0] * devices
        self.reserved = [0] * devices
        self.peak = [0] * devices
        self.peak_reserved = [0] * devices
        self.total = total
        self.calls: list[str] = []
        self.memory = StubCudaMemory(self)
        self.retries = 0  # num_alloc_retries: the allocator freed its cache and retried

    def is_initialized(self) -> bool:
        return self.initialized

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return 0

    def device_count(self) -> int:
        return len(self.allocated)

    def memory_allocated(self, i: int) -> int:
        return self.allocated[i]

    def memory_reserved(self, i: int) -> int:
        return self.reserved[i]

    def max_memory_allocated(self, i: int) -> int:
        return self.peak[i]

    def max_memory_reserved(self, i: int) -> int:
        return self.peak_reserved[i]

    def synchronize(self, i: int | None = None) -> None:
        pass

    def get_device_properties(self, i: int) -> SimpleNamespace:
        return SimpleNamespace(total_memory=self.total)

    def alloc(self, i: int, nbytes: int) -> None:
        """Simulate tensors of ``nbytes`` allocated on device ``i``."""
        self.allocated[i] += nbytes
        self.reserved[i] = max(self.reserved[i], self.allocated[i] + (2 << 20))
        self.peak[i] = max(self.peak[i], self.allocated[i])
        self.peak_reserved[i] = max(self.peak_reserved[i], self.reserved[i])

    def free(self, i: int, nbytes: int) -> None:
        self.allocated[i] -= nbytes

    def memory_stats(self, i: int) -> dict[str, int]:
        # The cache beyond what is allocated, all of it split blocks: a fragmented device.
        return {
            "num_alloc_retries": self.retries,
            "inactive_split_bytes.all.current": self.reserved[i] - self.allocated[i],
            "num_ooms": 0,
        }

    def host_memory_stats(self) -> dict[str, int]:
        return {"allocated_bytes.current": 64 << 20, "active_bytes.current": 16 << 20}

    def empty_cache(self) -> None:
        self.calls.append("empty_cache")
        self.reserved = list(self.allocated)

    def reset_peak_memory_stats(self, i: int) -> None:
        self.calls.append(f"reset_peak_memory_stats({i})")
        self.peak[i] = self.allocated[i]
        self.peak_reserved[i] = self.reserved[i]


class StubCudaMemory:
    """A stand-in for ``torch.cuda.memory``: allocation history and snapshots."""

    def __init__(self, cuda: StubCuda) -> None:
        self.cuda = cuda
        self.recording: int | None = None  # max_entries while recording

    def _record_memory_history(self, enabled: str | None = "all", max_entries: int = 1) -> None:
        self.cuda.calls.append(f"record_history({enabled}, {max_entries})")
        self.recording = None if enabled is None else max_entries

    def _dump_snapshot(self, filename: str) -> None:
        # The shape of torch.cuda.memory._snapshot(): segments, and traces while recording.
        snapshot = {
            "segments": [{"device": i, "total_size": r} for i, r in enumerate(self.cuda.reserved)],
            "device_traces": [[{"action": "alloc"}] if self.recording else []],
        }
        with open(filename, "wb") as f:
            pickle.dump(snapshot, f)


@pytest.fixture
def stub_cuda():
    """A stub CUDA runtime: 1 device, 80 GiB."""
    return StubCuda()


@pytest.fixture
def runtime_dir(monkeypatch):
    """A private, short agent runtime directory (Unix socket paths are limited to ~104 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="tm-rt-"))
    path.chmod(0o700)
    monkeypatch.setenv("TORCHMEM_RUNTIME_DIR", str(path))
    yield path
    import shutil

    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def settings_path(tmp_path):
    return str(tmp_path / "settings.ini")


@pytest.fixture
def make_window(qtbot, settings_path):
    """Windows with private settings and one process backend, closed after the test."""
    windows = []

    def make(backends=None):
        from PySide6.QtCore import QSettings

        from torchmem.gui.windows.main_window import MainWindow
        from torchmem.probe.backends import ProcessBackend
        from torchmem.session import Session
        from torchmem.sources.inprocess import InProcessSource

        source = InProcessSource(Session(), backends or [ProcessBackend()])
        window = MainWindow(source, QSettings(settings_path, QSettings.IniFormat))
        qtbot.addWidget(window)
        window.show()
        windows.append(window)
        return window

    yield make
    for window in windows:
        window.close()
