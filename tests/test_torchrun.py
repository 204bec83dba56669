"""Every rank of a torchrun job (gloo, 2 ranks on CPU): headless, attached, and in the window."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from conftest import SCRIPTS
from helpers import check_summary, end_process_tree, holder_text
from test_agent import start, wait_until

from torchmem.cli.attach import attach_headless
from torchmem.cli.launch import hook_dir
from torchmem.sources.processes import agents_for

pytestmark = pytest.mark.slow

TORCHRUN = ["-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone"]


def job(*script_args):
    """`torchmem run -- torchrun ... ddp_train.py ARGS` as a child process."""
    return start(
        ["-m", "torchmem", "run", "--", sys.executable, *TORCHRUN, str(SCRIPTS / "ddp_train.py"),
         *script_args]
    )  # fmt: skip


def stop_job(proc):
    """Ctrl+C the job as a user would (torchrun forwards it to the ranks); kill the whole
    tree if stuck."""
    end_process_tree(proc)


def wait_for_ranks(proc, n=2, timeout=90):
    wait_until(lambda: len(agents_for(proc.pid)) >= n or proc.poll() is not None, timeout)
    ranks = agents_for(proc.pid)
    assert len(ranks) == n, f"ranks: {ranks}; output: {proc.poll() and proc.communicate()}"
    return ranks


def test_torchmem_run_torchrun_serves_every_rank_and_sums_them(runtime_dir, tmp_path):
    out = tmp_path / "job.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torchmem", "run", "--summary", str(out), "--", sys.executable,
         *TORCHRUN, str(SCRIPTS / "ddp_train.py"), "--steps", "30", "--sleep", "0.03"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "rank 0 finished 30 steps" in proc.stdout and "rank 1 finished 30 steps" in proc.stdout
    data = check_summary(json.loads(out.read_text()))
    assert [(r["rank"], r["world_size"], r["status"]) for r in data["ranks"]] == [
        (0, 2, "finished"),
        (1, 2, "finished"),
    ], "two ranks, and not the launcher"
    assert data["kind"] == "job" and data["steps"] >= 30, data["steps"]
    peaks = data["peak_bytes"]
    assert peaks["total/cpu_rss"] >= max(peaks["rank0/cpu_rss"], peaks["rank1/cpu_rss"])
    # Each rank's row carries its own peaks, named within it (what tune reads of a job).
    assert [r["peak_bytes"]["cpu_rss"] for r in data["ranks"]] == [
        peaks["rank0/cpu_rss"],
        peaks["rank1/cpu_rss"],
    ]
    assert "2 processes with torch" in proc.stderr


def test_attach_to_the_launcher_follows_both_ranks_and_survives_a_dead_rank(runtime_dir, tmp_path):
    proc = job("--sleep", "0.05")
    try:
        ranks = wait_for_ranks(proc)
        assert sorted(e.rank for e in ranks) == [0, 1]
        out = tmp_path / "attach.json"
        assert attach_headless(proc.pid, 2.0, str(out), quiet=True) == 0
        data = check_summary(json.loads(out.read_text()))
        assert sorted(r["rank"] for r in data["ranks"]) == [0, 1]
        assert {"rank0/cpu_rss", "rank1/cpu_rss", "total/cpu_rss"} <= set(data["peak_bytes"])
        assert data["samples"] > 20

        # A rank killed while attached: shown as ended, the other rank still followed.
        from torchmem.session import Session
        from torchmem.sources.attached import AttachedRun

        session = Session()
        run = AttachedRun(session, proc.pid)
        run.connect()
        wait_until(lambda: session.steps.steps > 3)
        victim = next(e for e in ranks if e.rank == 1)
        import os

        os.kill(victim.pid, signal.SIGKILL)
        wait_until(lambda: any("rank 1: detached" in r.text for r in session.logs), 30)
        line = next(r.text for r in session.logs if "rank 1: detached" in r.text)
        assert "without a word (killed or crashed)" in line, line
        assert any(m.label == "rank 1 ended" for m in session.user_markers())
        assert session.run_finished is None, "one dead rank does not end the job's view"
        run.detach()
        run.follow()
    finally:
        stop_job(proc)


def test_a_job_ends_with_the_torchmem_that_runs_it_however_it_is_killed(runtime_dir):
    # kill -9 of torchmem (or a lost SSH session) left torchrun and its ranks training,
    # orphaned, with nobody watching: they now get SIGTERM when torchmem dies.
    import psutil

    proc = job("--sleep", "0.05")
    try:
        ranks = wait_for_ranks(proc)
        launcher = psutil.Process(proc.pid).children()
        job_pids = [p.pid for p in launcher] + [e.pid for e in ranks]
        proc.kill()
        proc.wait()

        def alive(pid):
            try:
                return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return False

        wait_until(lambda: not any(alive(pid) for pid in job_pids), 60, "the job to end")
    finally:
        stop_job(proc)


@pytest.mark.usefixtures("runtime_dir")
def test_window_shows_one_trace_per_rank_a_total_and_a_rank_filter(qtbot, make_window):
    proc = job("--sleep", "0.05")
    try:
        wait_for_ranks(proc)
        window = make_window()
        window.attach(proc.pid)
        qtbot.waitUntil(lambda: window._rank_combo_action.isVisible(), timeout=30_000)
        qtbot.waitUntil(lambda: window.rank_combo.count() == 4, timeout=30_000)
        items = [window.rank_combo.itemText(i) for i in range(window.rank_combo.count())]
        assert items == ["Every rank", "Rank 0", "Rank 1", "Total"]
        # The rank chooser and the plot follow the same refresh, but the job's total can
        # arrive between the two: the plot draws it at its next refresh.
        traces = {"rank0/cpu/rss", "rank1/cpu/rss", "total/cpu/rss"}
        qtbot.waitUntil(lambda: traces <= set(window.plot.curve_keys()), timeout=5_000)
        assert "rank 1 process RSS" in [window.plot._curves[k].name() for k in window.plot._curves]
        window.rank_combo.setCurrentIndex(window.rank_combo.findData("rank1"))
        visible = window.plot.visible_keys()
        assert visible and all(k.startswith("rank1/") for k in visible)

        # A census of each rank, named after its rank, and its tensors' referrers asked of
        # the right process.
        # Both ranks past their set-up (gloo's init can take seconds on a loaded machine):
        # a census before it would rightly miss rank_buffer.
        qtbot.waitUntil(lambda: window.session.steps.steps >= 3, timeout=60_000)
        window.act_census.trigger()
        # The user's census of a rank (an automatic one may be shown before it lands).
        qtbot.waitUntil(
            lambda: window.tensors._shown is not None and window.tensors._shown.trigger == "user",
            timeout=60_000,
        )
        census = window.tensors.model.census
        assert window.tensors._shown.scope in ("rank0", "rank1")
        assert census.devices() == ["cpu"], "a rank's devices keep their own names"
        buffer = next(t for t in census.tensors() if t.name == "rank_buffer")
        assert "rank_buffer" in holder_text(qtbot, window, buffer)
        window.detach()
        qtbot.waitUntil(lambda: not window.running, timeout=10_000)
    finally:
        stop_job(proc)


@pytest.mark.usefixtures("runtime_dir")
def test_a_three_rank_jobs_views_totals_and_recording_agree_per_rank(qtbot, make_window):
    """Each view, the job's total and the recording tell the same story of each rank."""
    from torchmem.record.library import list_sessions, sessions_dir
    from torchmem.record.replay import load
    from torchmem.report.recorded import recorded_summary
    from torchmem.units import format_bytes

    three = [a.replace("=2", "=3") for a in TORCHRUN]
    proc = start(
        ["-m", "torchmem", "run", "--", sys.executable, *three, str(SCRIPTS / "ddp_train.py"),
         "--sleep", "0.05"]
    )  # fmt: skip
    ranks = [f"rank{r}" for r in range(3)]
    try:
        wait_for_ranks(proc, n=3, timeout=120)
        window = make_window()
        window.attach(proc.pid)
        qtbot.waitUntil(lambda: window.rank_combo.count() == 5, timeout=60_000)
        items = [window.rank_combo.itemText(i) for i in range(window.rank_combo.count())]
        assert items == ["Every rank", "Rank 0", "Rank 1", "Rank 2", "Total"]
        qtbot.waitUntil(lambda: window.session.steps.steps >= 3, timeout=60_000)
        window.act_census.trigger()
        session = window.session
        qtbot.waitUntil(
            lambda: all(session.censuses(r)[0] is not None for r in ranks), timeout=60_000
        )
        # Each rank's answer to the census asked of the job.
        qtbot.waitUntil(
            lambda: len([c for c in session.commands if c.command == "census"]) == 3,
            timeout=60_000,
        )
        said = [c.said for c in session.commands if c.command == "census"]
        window.detach()
        qtbot.waitUntil(lambda: not window.running, timeout=10_000)
    finally:
        stop_job(proc)
    window.bridge.flush()
    latest = session.latest()
    rss = {r: latest[f"{r}/cpu/rss"][0] for r in ranks}
    # The job's total is the sum of each rank's newest reading (ranks report from their
    # own threads: one may be a sample newer than the total that counted it).
    assert latest["total/cpu/rss"][0] == pytest.approx(sum(rss.values()), rel=0.02)
    for rank in ranks:
        key = f"{rank}/cpu/rss"
        assert window.readings.row_text(key)[1].startswith(format_bytes(rss[rank]))
        assert window.plot._xy[key][1][-1] == rss[rank]
        taken = session.censuses(rank)[0]
        census = taken.census
        assert taken.scope == rank and census.devices() == ["cpu"]
        buffer = next(t for t in census.tensors() if t.name == "rank_buffer")
        own = census.storages[buffer.storage_key].nbytes
        assert own == (int(rank[-1]) + 1) * 2**20, "each rank's own buffer"
        # Its census said (in the log and the status bar) as this rank's ("rank 2:
        # Census: ..."), not as the job's one process.
        assert any(m.startswith(f"rank {rank[-1]}: Census: ") for m in said), said

    # One rank chosen: every view shows that rank and only it.
    window.rank_combo.setCurrentIndex(window.rank_combo.findData("rank2"))
    assert window.view.scope == "rank2"
    visible = window.plot.visible_keys()
    assert visible and all(k.startswith("rank2/") for k in visible)
    shown = [k for k, row in window.readings._rows.items() if not window.readings.isRowHidden(row)]
    assert shown and all(k.startswith("rank2/") for k in shown)
    assert window.tensors.scope == "rank2" and "rank 2 · cpu" in window.tensors.headline.text()
    assert window.breakdown.device == ("rank2", "cpu")
    assert window.breakdown.device_combo.currentText() == "rank 2 · cpu"

    # The recording reopens with the same series, per rank and total, point for point.
    window.recordings.recorder.wait_closed()
    (entry,) = list_sessions(sessions_dir())
    keys = session.keys()
    live = {k: session.arrays(k) for k in keys}
    peaks = session.peak_bytes()
    assert {"rank0/cpu_rss", "rank1/cpu_rss", "rank2/cpu_rss", "total/cpu_rss"} <= set(peaks)
    recorded = recorded_summary(load(entry.path))
    assert recorded["peak_bytes"] == {k: int(v) for k, v in peaks.items()}
    assert "detached" in recorded["message"]
    window.session.reset()
    assert window.recordings.open(entry.path)
    for key, (t, v) in live.items():
        t_again, v_again = window.session.arrays(key)
        assert t_again.tolist() == t.tolist() and v_again.tolist() == v.tolist(), key
    assert window.session.peak_bytes() == peaks


def test_serve_inside_a_plain_torchrun_script_registers_each_rank(runtime_dir):
    proc = start([*TORCHRUN, str(SCRIPTS / "ddp_train.py"), "--serve", "--steps", "0"])
    try:
        ranks = wait_for_ranks(proc)
        assert sorted((e.rank, e.local_rank, e.world_size) for e in ranks) == [
            (0, 0, 2),
            (1, 1, 2),
        ]
        assert all(e.pid != proc.pid for e in ranks), "the launcher itself has no agent"
    finally:
        stop_job(proc)


def test_max_steps_ends_every_rank_of_an_endless_job_cleanly(runtime_dir, tmp_path):
    out = tmp_path / "job.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torchmem", "run", "--max-steps", "3", "--summary", str(out),
         "--", sys.executable, *TORCHRUN, str(SCRIPTS / "ddp_train.py"), "--sleep", "0.02"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # ddp_train.py alone would never end
    data = check_summary(json.loads(out.read_text()))
    assert data["max_steps"] == 3 and data["steps"] == 3
    assert [(r["rank"], r["run_status"], r["steps"]) for r in data["ranks"]] == [
        (0, "finished", 3),
        (1, "finished", 3),
    ]
    assert all(r["message"] == "stopped after 3 steps (--max-steps)" for r in data["ranks"])
    assert data["step_time_s"] == max(r["step_time_s"] for r in data["ranks"]) > 0
    assert "finished 3 steps" not in proc.stdout  # stopped at the step, not at the loop's end


def test_mp_spawn_ranks_are_labelled_by_rank_and_come_with_their_parent(runtime_dir, tmp_path):
    """The DDP tutorial's mp.spawn: ranks learn their rank in init_process_group, not from
    the environment. They are still shown as rank 0 and rank 1 (they were pid labels), by
    `torchmem run -- COMMAND` and when attaching to the script (it serves itself too)."""
    out = tmp_path / "job.json"
    proc = subprocess.run(
        [sys.executable, "-m", "torchmem", "run", "--summary", str(out), "--", sys.executable,
         str(SCRIPTS / "ddp_spawn.py"), "--steps", "40"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = check_summary(json.loads(out.read_text()))
    assert [(r["rank"], r["world_size"]) for r in data["ranks"]] == [(None, None), (0, 2), (1, 2)]
    assert {"rank0/cpu_rss", "rank1/cpu_rss"} <= set(data["peak_bytes"]), data["peak_bytes"]

    until = tmp_path / "stop"
    script = start([str(SCRIPTS / "ddp_spawn.py"), "--steps", "0", "--until", str(until)],
                   env={"TORCHMEM_AUTOSERVE": "1", "PYTHONPATH": str(hook_dir())})  # fmt: skip
    try:
        wait_until(lambda: len(agents_for(script.pid)) == 3 or script.poll() is not None, 90)
        found = agents_for(script.pid)
        assert [(e.pid == script.pid, e.rank) for e in found] == [(True, None), (False, 0),
                                                                  (False, 1)], found  # fmt: skip
        attached = tmp_path / "attach.json"
        assert attach_headless(script.pid, 1.5, str(attached), quiet=True) == 0
        ranks = check_summary(json.loads(attached.read_text()))["ranks"]
        assert [r["rank"] for r in ranks] == [None, 0, 1]
    finally:
        until.touch()
        script.communicate(timeout=60)
