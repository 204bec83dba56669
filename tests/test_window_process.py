"""The window as a process: what happens to its children when it dies, and forks in it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from conftest import ROOT, SCRIPTS

pytestmark = pytest.mark.slow


def _torchmem_window(args: list[str], tmp_path) -> subprocess.Popen[str]:
    env = dict(
        os.environ,
        QT_QPA_PLATFORM="offscreen",
        XDG_CONFIG_HOME=str(tmp_path / "config"),  # private settings
        PYTHONUNBUFFERED="1",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "torchmem", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=ROOT,
    )


def _isolated_child(window: subprocess.Popen[str], timeout: float = 120.0) -> psutil.Process:
    """The `torchmem run --attachable` child of an isolated run, once it trains."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert window.poll() is None, window.stdout.read()[-3000:]
        for child in psutil.Process(window.pid).children():
            try:
                cmd = child.cmdline()
            except psutil.Error:
                continue
            if "--attachable" in cmd and child.cpu_times().user > 1.0:  # torch imported
                return child
        time.sleep(0.2)
    raise AssertionError("the isolated child never started")


def _lives(proc: psutil.Process) -> bool:
    # An ended child whose new parent has not reaped it yet is a zombie: it does not train.
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize(
    ("sig", "training"), [(signal.SIGKILL, True), (signal.SIGKILL, False), (signal.SIGTERM, True)]
)
def test_an_isolated_child_never_outlives_its_window(tmp_path, runtime_dir, sig, training):
    window = _torchmem_window(["--isolated", str(SCRIPTS / "train_forever.py")], tmp_path)
    child = None
    try:
        child = _isolated_child(window)
        if training:  # attached and stepping (it idles while it waits for the window)
            busy = child.cpu_times().user + 2.0
            deadline = time.monotonic() + 120
            while child.cpu_times().user < busy and time.monotonic() < deadline:
                time.sleep(0.2)
        window.send_signal(sig)
        window.wait(timeout=30)
        deadline = time.monotonic() + 20
        while _lives(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _lives(child), f"the isolated child {child.pid} outlived its window"

    finally:
        for proc in (window,):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if window.stdout:
            window.stdout.close()
        if child is not None and _lives(child):
            child.kill()


def test_kill_closes_the_window_as_ctrl_c_does_and_its_recording_ends_with_the_run(
    tmp_path, runtime_dir, monkeypatch
):
    # SIGTERM (`kill PID`, a logout) ended the window at once: the recording of the run it
    # was showing listed as "interrupted" and its report blamed kill -9 or a crash.
    from torchmem.record.library import list_sessions

    folder = tmp_path / "sessions"
    monkeypatch.setenv("TORCHMEM_SESSIONS_DIR", str(folder))
    window = _torchmem_window([str(SCRIPTS / "train_forever.py")], tmp_path)
    try:
        for line in window.stdout:  # the script's output is echoed to the terminal
            if "training" in line:
                break
        window.send_signal(signal.SIGTERM)
        assert window.wait(timeout=60) == 0
    finally:
        if window.poll() is None:
            window.kill()
            window.wait()
        window.stdout.close()
    (entry,) = list_sessions(folder)
    assert entry.status == "stopped" and entry.samples > 0, (entry.status, entry.meta)
