"""Injecting the agent into a plain `python script.py` through gdb (a pending call)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import SCRIPTS
from helpers import check_summary
from test_agent import start, wait_until

from torchmem.session import Session
from torchmem.sources.remote import RemoteSource
from torchmem.transport.inject import InjectError, gdb_unsafe_here, inject_agent

pytestmark = [
    pytest.mark.slow,  # each test starts a script and gdb
    pytest.mark.skipif(
        bool(GDB_UNSAFE := gdb_unsafe_here()), reason=f"no injection here: {GDB_UNSAFE}"
    ),
]


@pytest.fixture
def plain(runtime_dir):
    procs = []

    def launch(*args):
        proc = start([str(SCRIPTS / "plain_train.py"), *args])
        assert proc.stdout.readline().strip() == "training"
        procs.append(proc)
        return proc

    yield launch
    for proc in procs:
        proc.kill()
        proc.communicate()


def _inject_or_skip(pid, **kwargs):
    try:
        return inject_agent(pid, **kwargs)
    except InjectError as exc:
        if "does not let this process trace" in str(exc):
            pytest.skip(f"ptrace refused here: {exc}")
        raise


def test_injected_agent_shows_steps_and_names_like_a_served_one(plain, runtime_dir):
    proc = plain()
    entry = _inject_or_skip(proc.pid)
    assert entry.pid == proc.pid
    assert not list(runtime_dir.glob("inject-*")), "the injected script is removed"
    session = Session()
    remote = RemoteSource(session, entry)
    try:
        remote.connect()
        wait_until(lambda: session.steps.steps >= 5, what="steps of the injected process")
        remote.command("census")
        wait_until(lambda: session.census is not None)
        names = {t.name for t in session.census.census.tensors()}
        assert "plain_buffer" in names and "model.weight" in names
    finally:
        remote.close()
    assert proc.poll() is None, "the target carries on"


def test_a_target_blocked_in_a_c_call_times_out_with_an_explanation(plain):
    proc = plain("--block")
    with pytest.raises(InjectError, match="never reached a safe point"):
        _inject_or_skip(proc.pid, timeout=2.0)


def test_cli_attach_inject_summary(plain, tmp_path):
    proc = plain()
    out = tmp_path / "inj.json"
    result = subprocess.run(
        [sys.executable, "-m", "torchmem", "attach", "--inject", "--duration", "1.5",
         "--summary", str(out), str(proc.pid)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if "does not let this process trace" in result.stderr:
        pytest.skip("ptrace refused here")
    assert result.returncode == 0, result.stderr
    data = check_summary(json.loads(out.read_text()))
    assert data["injected"] is True and data["attached"] == "agent" and data["samples"] >= 5
    assert data["steps"] > 0
