"""The agent and attach: served scripts, `torchmem run --attachable`, reconnects, kill -9."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest
from conftest import SCRIPTS
from helpers import check_summary

from torchmem.events import CensusTaken, CommandResult, Marker, MarkerKind, RunStatus
from torchmem.session import Session
from torchmem.sources.remote import RemoteSource
from torchmem.transport.client import AttachError
from torchmem.transport.discovery import find_agent, list_agents

# Starts torchmem, agent or training processes (conftest checks the mark).
pytestmark = pytest.mark.slow


def start(args, env=None):
    """A child python process; its stdout is a pipe we read lines from."""
    return subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def wait_for_agent(proc, timeout=60.0):
    """The discovery entry of ``proc`` once its agent is up (the process must live)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entry = find_agent(proc.pid)
        if entry is not None:
            return entry
        if proc.poll() is not None:
            raise AssertionError(f"process ended before serving: {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError("the agent never published its entry")


def wait_until(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


class Recorder:
    """Everything the Session hears, by type, thread-safely."""

    def __init__(self, session):
        self.events = []
        self._lock = threading.Lock()
        session.subscribe(self._add)

    def _add(self, event):
        with self._lock:
            self.events.append(event)

    def of(self, kind):
        with self._lock:
            return [e for e in self.events if isinstance(e, kind)]


@pytest.fixture
def served(runtime_dir):
    """A served training loop (until stopped) and its agent entry."""
    proc = start([str(SCRIPTS / "served_train.py"), "--sleep", "0.02"])
    try:
        yield proc, wait_for_agent(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=30)


def test_served_script_streams_samples_steps_and_censuses(served, runtime_dir):
    proc, entry = served
    # The entry and the socket are private to the user.
    assert stat.S_IMODE(runtime_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((runtime_dir / f"agent-{proc.pid}.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(os.stat(entry.address).st_mode) == 0o600
    assert entry.argv[0].endswith("served_train.py") and entry.torch

    session = Session()
    seen = Recorder(session)
    remote = RemoteSource(session, entry)
    try:
        remote.connect()
        assert "cpu" in remote.capacity() and remote.has_accelerator is False
        wait_until(lambda: session.steps.steps >= 15, what="15 steps from the agent")
        assert session.run_started is not None and session.run_started.mode == "served"
        assert "cpu/rss" in session.series
        wait_until(
            lambda: any(
                m.kind is MarkerKind.USER and m.label.startswith("every ten")
                for m in seen.of(Marker)
            ),
            what="the script's own torchmem.mark()",
        )

        remote.command("census")
        wait_until(lambda: seen.of(CensusTaken), what="a census event")
        census = seen.of(CensusTaken)[-1].census
        names = {t.name for t in census.tensors()}
        assert "served_buffer" in names, "script variables name tensors of an attached run"
        assert any(n.endswith(".weight") for n in names)
        assert any("Adam.state[" in n for n in names)
        assert census.total_bytes("cpu") >= 256 * 1024 * 4

        remote.command("gc_collect")
        wait_until(lambda: any(c.command == "gc_collect" for c in seen.of(CommandResult)))
        assert next(c for c in seen.of(CommandResult) if c.command == "gc_collect").ok

        remote.command("snapshot")  # a CPU process: refused, and said once, not twice
        wait_until(lambda: any(c.command == "snapshot" for c in seen.of(CommandResult)))
        refused = [c for c in seen.of(CommandResult) if c.command == "snapshot"]
        assert len(refused) == 1 and not refused[0].ok
        assert "has not used CUDA" in refused[0].message and refused[0].output == ""

        remote.mark("from the viewer")
        wait_until(lambda: any(m.label == "from the viewer" for m in seen.of(Marker)))

        chain = remote.referrers(next(t for t in census.tensors() if t.name == "served_buffer"))
        assert chain["alive"] and any("served_buffer" in line for line in chain["chain"])

        remote.command("stop")
        wait_until(lambda: session.run_finished is not None, what="the run's end")
        assert session.run_finished.status is RunStatus.STOPPED
        assert "stopped by the user" in session.run_finished.message
        proc.wait(timeout=30)
    finally:
        remote.close()
    wait_until(lambda: find_agent(proc.pid) is None, what="the entry to go")
    assert not (runtime_dir / f"agent-{proc.pid}.json").exists(), "the agent cleans up on exit"


def test_viewer_disconnects_and_a_late_viewer_gets_the_history(served):
    proc, entry = served
    first = Session()
    remote = RemoteSource(first, entry)
    remote.connect()
    wait_until(lambda: first.steps.steps >= 5)
    remote.close()
    assert remote.end_reason == "closed"
    steps_at_leave = first.steps.steps
    time.sleep(0.3)  # training goes on without a viewer

    second = Session()
    again = RemoteSource(second, entry)
    try:
        again.connect()
        wait_until(lambda: second.steps.steps > steps_at_leave + 3, what="steps after rejoin")
        times, _ = second.arrays("cpu/rss")
        # The replay starts where the agent started: earlier than the reconnect itself.
        assert times[0] < second.now() - 0.5
        assert second.run_started is not None
    finally:
        again.close()
    assert proc.poll() is None, "viewers leaving never stops training"


def test_kill_9_while_attached_is_an_exit_and_the_stale_entry_goes(served, runtime_dir):
    proc, entry = served
    session = Session()
    remote = RemoteSource(session, entry)
    try:
        remote.connect()
        wait_until(lambda: session.samples > 3)
        time.sleep(1.0)  # a run that lasted a while: its duration must not read 0.0 s
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert remote.ended.wait(10), "the viewer notices the dead process"
        result = session.run_finished
        assert result is not None
        assert result.status is RunStatus.KILLED, "killed or crashed, exit status unknown"
        assert f"process {proc.pid} ended while attached" in result.message
        assert "exit status unknown" in result.message
        assert result.duration_s >= 1.0, result
    finally:
        remote.close()
    assert (runtime_dir / f"agent-{proc.pid}.json").exists(), "kill -9 leaves the entry behind"
    assert all(e.pid != proc.pid for e in list_agents()), "listing ignores it"
    assert not (runtime_dir / f"agent-{proc.pid}.json").exists(), "and removes it"
    with pytest.raises(AttachError, match=r"gone|refused"):
        RemoteSource(Session(), entry).connect()


def test_a_script_that_raises_reports_its_traceback_to_the_viewer(runtime_dir):
    proc = start([str(SCRIPTS / "served_train.py"), "--fail-at", "40", "--sleep", "0.05"])
    session = Session()
    remote = RemoteSource(session, wait_for_agent(proc))
    try:
        remote.connect()
        wait_until(lambda: session.run_finished is not None, what="the failure")
        finished = session.run_finished
        assert finished.status is RunStatus.FAILED
        assert "RuntimeError: failed on purpose at step 40" in finished.message + finished.traceback
        assert "served_train.py" in finished.traceback
    finally:
        remote.close()
        proc.wait(timeout=30)
        proc.communicate()
    assert proc.returncode == 1


def test_torchmem_run_attachable_streams_logs_and_the_exit_code(runtime_dir):
    proc = start(
        ["-m", "torchmem", "run", "--attachable", str(SCRIPTS / "served_train.py"),
         "--steps", "60", "--sleep", "0.03"]
    )  # fmt: skip
    session = Session()
    remote = RemoteSource(session, wait_for_agent(proc))
    try:
        remote.connect()
        wait_until(lambda: session.run_finished is not None, what="the run's end")
        assert session.run_finished.status is RunStatus.FINISHED
        assert session.run_finished.exit_code == 0
        assert session.steps.steps == 60
        assert any("finished 60 steps" in r.text for r in session.logs), "stdout is forwarded"
        assert session.run_started.mode == "thread"
    finally:
        remote.close()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"attachable as pid {proc.pid}" in err
    assert "finished 60 steps" in out, "the terminal still gets the output"


def test_cli_ps_and_attach_summary(served, tmp_path):
    proc, entry = served
    # Past its first step before the attach (on a loaded machine its set-up can outlast
    # the attach's 1.5 s, and a summary of no step cannot say it was still stepping).
    session = Session()
    remote = RemoteSource(session, entry)
    try:
        remote.connect()
        wait_until(lambda: session.steps.steps >= 1, what="a step from the agent")
    finally:
        remote.close()
    ps = subprocess.run(
        [sys.executable, "-m", "torchmem", "ps", "--json"], capture_output=True, text=True
    )
    assert ps.returncode == 0, ps.stderr
    rows = {r["pid"]: r for r in json.loads(ps.stdout)}
    assert rows[proc.pid]["attachable"] is True
    assert "token" not in json.dumps(rows[proc.pid]), "ps never prints a token"
    text = subprocess.run(
        [sys.executable, "-m", "torchmem", "ps"], capture_output=True, text=True
    ).stdout
    assert str(proc.pid) in text and "served_train.py" in text

    out, recorded = tmp_path / "attach.json", tmp_path / "attach.tmsession"
    result = subprocess.run(
        [sys.executable, "-m", "torchmem", "attach", "--duration", "1.5", "--summary",
         str(out), "--record", str(recorded), str(proc.pid)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert f"recorded in {recorded}" in result.stderr
    report = subprocess.run(
        [sys.executable, "-m", "torchmem", "report", "--json", str(recorded)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    again = check_summary(json.loads(report.stdout))
    assert again["kind"] == "attach" and "status" not in again, "a detach is not an end"
    assert "detached after" in again["message"] and "the process went on" in again["message"]
    assert again["samples"] >= 10
    data = check_summary(json.loads(out.read_text()))
    assert data["pid"] == proc.pid and data["injected"] is False
    assert data["samples"] >= 10 and data["peak_bytes"]["cpu_rss"] > 50 << 20
    (row,) = data["ranks"]
    assert {k: row[k] for k in ("pid", "rank", "world_size", "status", "ended", "host")} == {
        "pid": proc.pid, "rank": None, "world_size": None, "status": "running", "ended": False,
        "host": None,
    }  # fmt: skip
    assert row["run_status"] is None and row["steps"] > 0, row  # still running: no end said
    assert data["kind"] == "attach" and data["duration_s"] >= 1.5


def test_cli_attach_to_a_process_without_agent_watches_it_from_outside(tmp_path, runtime_dir):
    proc = start(["-c", "import time, torch; x = torch.ones(1 << 22); time.sleep(30)"])
    try:
        wait_until(lambda: _rss(proc.pid) > 80 << 20, what="the child to load torch")
        out = tmp_path / "plain.json"
        result = subprocess.run(
            [sys.executable, "-m", "torchmem", "attach", "--duration", "1", "--summary",
             str(out), str(proc.pid)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert "from outside" in result.stderr
        data = check_summary(json.loads(out.read_text()))
        assert data["attached"] == "process" and data["ranks"] == []
        assert data["samples"] >= 5 and data["peak_bytes"]["cpu_rss"] > 80 << 20
        ps = subprocess.run(
            [sys.executable, "-m", "torchmem", "ps", "--json"], capture_output=True, text=True
        )
        rows = {r["pid"]: r for r in json.loads(ps.stdout)}
        assert rows[proc.pid]["attachable"] is False, "plain torch processes are listed too"
    finally:
        proc.kill()
        proc.communicate()


def test_cli_attach_to_a_missing_pid_says_so():
    result = subprocess.run(
        [sys.executable, "-m", "torchmem", "attach", "--duration", "1", "999999999"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 1
    assert "no process with pid 999999999" in result.stderr


def _rss(pid):
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0


def test_cli_attach_through_a_copied_entry_and_a_given_socket(served, tmp_path):
    """What SSH forwarding needs: the entry copied over, the socket reached elsewhere."""
    _, entry = served
    copied = tmp_path / "agent.json"
    copied.write_text(json.dumps({**entry.__dict__, "address": "/nonexistent.sock"}))
    out = tmp_path / "fwd.json"
    result = subprocess.run(
        [sys.executable, "-m", "torchmem", "attach", "--entry", str(copied), "--address",
         entry.address, "--duration", "1", "--summary", str(out)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["samples"] >= 5
    copied.write_text("not json")
    bad = subprocess.run(
        [sys.executable, "-m", "torchmem", "attach", "--entry", str(copied)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "is not a torchmem agent entry" in bad.stderr


def test_cli_attach_snapshot_records_history_and_lists_the_file(
    stub_cuda, runtime_dir, tmp_path, monkeypatch, capsys
):
    from torchmem.agent import Agent
    from torchmem.cli.attach import attach_headless
    from torchmem.probe.backends import ProcessBackend, TorchAllocatorBackend
    from torchmem.sources.inprocess import InProcessSource

    monkeypatch.setenv("TORCHMEM_SNAPSHOT_DIR", str(tmp_path / "snaps"))
    source = InProcessSource(
        Session(), backends=[ProcessBackend(), TorchAllocatorBackend(stub_cuda, "cuda")], hz=20
    )
    source.sampler.start()
    agent = Agent(source)
    agent.start()
    try:
        out = tmp_path / "attach.json"
        assert attach_headless(os.getpid(), 0.5, str(out), snapshot=True) == 0
    finally:
        agent.close(linger_s=0)
        source.close()
    (path,) = json.loads(out.read_text())["snapshots"]
    assert os.path.dirname(path) == str(tmp_path / "snaps") and os.path.getsize(path) > 0
    assert f"memory snapshot {path}" in capsys.readouterr().err
    recorded = [c for c in stub_cuda.calls if c.startswith("record_history")]
    assert recorded == ["record_history(all, 100000)", "record_history(None, 1)"], (
        "recording starts on attach and stops once the snapshot is written"
    )


def test_cli_attach_snapshot_without_cuda_or_agent_says_why(served, tmp_path):
    proc, _ = served
    out = tmp_path / "attach.json"
    result = subprocess.run(
        [sys.executable, "-m", "torchmem", "attach", "--snapshot", "--duration", "0.5",
         "--summary", str(out), str(proc.pid)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "no snapshot: allocation history records CUDA allocations" in result.stderr
    assert json.loads(out.read_text())["snapshots"] == []
    plain = start(["-c", "import time; time.sleep(30)"])
    try:
        result = subprocess.run(
            [sys.executable, "-m", "torchmem", "attach", "--snapshot", "--duration", "0.5",
             str(plain.pid)],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        plain.kill()
        plain.communicate()
    assert result.returncode == 1
    assert f"--snapshot needs an agent in process {plain.pid}" in result.stderr


def test_listing_never_deletes_a_live_agent_after_a_clock_step(runtime_dir):
    """Only an entry whose process is proven gone is removed, with its socket."""
    from dataclasses import replace

    from torchmem.transport.discovery import AgentEntry, process_start_ticks, write_entry

    me = os.getpid()
    live = AgentEntry(
        pid=me, create_time=time.time() - 10_000,  # the wall clock stepped since it was written
        argv=["train.py"], cwd="/", python="3", torch="2", torchmem="0", protocol=1,
        address=str(runtime_dir / f"agent-{me}.sock"), token="0" * 64, hz=10.0,
        start_ticks=process_start_ticks(me),
    )  # fmt: skip
    write_entry(live, runtime_dir)
    (runtime_dir / f"agent-{me}.sock").touch()
    for _ in range(200):  # a viewer listing in a tight loop
        assert [e.pid for e in list_agents()] == [me]
    assert (runtime_dir / f"agent-{me}.sock").exists(), "a live agent's socket stays"
    reused = replace(live, start_ticks=live.start_ticks + 12345)  # pid reused by another
    write_entry(reused, runtime_dir)
    assert list_agents() == []
    assert not (runtime_dir / f"agent-{me}.sock").exists(), "a proven-dead entry goes"
