"""Recorded sessions: what is recorded reads back the same, survives kill -9, and every bad
file gives a clear message instead of a traceback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import census_of, check_summary

from torchmem.events import (
    Alert,
    AlertKind,
    AlertState,
    CapacityKnown,
    CensusTaken,
    JobMembers,
    LogRecord,
    Marker,
    MarkerKind,
    RunFinished,
    RunStarted,
    RunStatus,
    Sample,
    Severity,
    Stream,
)
from torchmem.record import library
from torchmem.record.recorder import start_recording
from torchmem.record.replay import load
from torchmem.record.store import RecordError, SessionFile
from torchmem.report.recorded import recorded_summary
from torchmem.report.summary import step_time
from torchmem.session import Session
from torchmem.tensors.model import Census, StorageInfo, TensorInfo

SCRIPTS = Path(__file__).parent / "scripts"


def _tensor(name: str, kind: str, nbytes: int, key: tuple[str, int]) -> TensorInfo:
    return TensorInfo(
        name=name, kind=kind, shape=(nbytes // 4,), stride=(1,), storage_offset=0,
        dtype="float32", device=key[0], numel=nbytes // 4, element_size=4,
        span_bytes=nbytes, is_view=False, is_contiguous=True, requires_grad=False,
        is_leaf=True, grad_fn="", pinned=False, storage_key=key,
    )  # fmt: skip


def _census(n: int, step: int) -> Census:
    storages = {}
    for i in range(n):
        key = ("cpu", 4096 * (i + 1))
        kind = ("parameter", "gradient", "activation")[i % 3]
        nbytes = 1024 * (i + 1)
        storages[key] = StorageInfo(key, nbytes, [_tensor(f"t{i}", kind, nbytes, key)])
    return Census(storages, [], 0.01, step)


def _play_run(session: Session) -> None:
    """A small run, event by event, as a source would submit it."""
    session.submit(RunStarted(0.0, "/x/train.py", ("--lr", "0.1")))
    for step in range(1, 21):
        t = step * 0.1
        session.submit(Sample(t, {"cpu/rss": 1e8 + step * 1e6, "cuda:0/allocated": 5e8 + step}))
        session.submit(Marker(t, MarkerKind.STEP, step=step))
        if step == 10:
            session.submit(CensusTaken(t, step, _census(2500, step), trigger="step"))
            session.submit(Marker(t, MarkerKind.EPOCH, "epoch 2", step))
            session.submit(LogRecord(t, Stream.STDOUT, "half way"))
    session.submit(
        Alert(1.5, "leak:cpu/rss", AlertKind.LEAK, Severity.WARNING, AlertState.ACTIVE,
              "cpu/rss", 5, 15, "cpu/rss grows 1 MiB per step", "del the list", 1e6, 6e8,
              ({"name": "history[*]", "bytes_per_step": 1000},), 15)
    )  # fmt: skip
    session.submit(RunFinished(2.1, RunStatus.FINISHED, 0, "finished", duration_s=2.1))


def test_a_recorded_run_reads_back_with_the_figures_it_had_live(tmp_path):
    live = Session()
    recorder = start_recording(tmp_path / "r.tmsession", live, "run", "/x/train.py", ["--lr"])
    _play_run(live)
    recorder.close({"summary": {"steps": 20}})
    assert recorder.error is None

    reopened = load(tmp_path / "r.tmsession")
    again = reopened.session
    assert reopened.complete and not reopened.problems
    assert again.samples == live.samples == 20
    assert again.peak_bytes() == live.peak_bytes()
    assert again.steps.steps == live.steps.steps == 20
    assert [m.label for m in again.user_markers()] == ["epoch 2"]
    assert [a.culprits for a in again.alert_list()] == [a.culprits for a in live.alert_list()]
    assert [r.text for r in again.logs] == ["half way"]
    # A census is recorded folded to its largest storages, with totals and kinds intact.
    census, _ = again.censuses()
    original = live.censuses()[0].census
    assert len(census.census.storages) < len(original.storages)
    assert census.census.total_bytes() == original.total_bytes()
    assert census.census.bytes_by_kind() == original.bytes_by_kind()
    largest = max(original.storages.values(), key=lambda s: s.nbytes)
    assert largest.key in census.census.storages
    data = check_summary(recorded_summary(reopened))
    assert data["status"] == "finished" and data["steps"] == 20
    assert data["script"] == "/x/train.py" and data["recording"]["complete"] is True


def test_a_full_disk_ends_the_recording_with_a_message_and_keeps_what_it_had(tmp_path):
    live = Session()
    problems: list[str] = []
    path = tmp_path / "full.tmsession"
    recorder = start_recording(path, live, "run", None, on_problem=problems.append)
    live.submit(Sample(0.1, {"cpu/rss": 1.0}))
    # SQLite says "database or disk is full" once a file reaches max_page_count pages.
    conn = recorder._conn
    conn.execute(f"PRAGMA max_page_count={conn.execute('PRAGMA page_count').fetchone()[0]}")
    for i in range(5000):  # the run goes on: submitting never raises
        live.submit(LogRecord(0.2, Stream.STDOUT, f"line {i} " + "x" * 200))
    recorder.close()
    assert problems and "disk is full" in problems[0]
    assert "the run goes on" in problems[0]
    assert load(path).session.samples <= 1


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", "is empty"),
        (b"this is not a database at all" * 100, "not a torchmem session"),
    ],
)
@pytest.mark.slow
def test_files_that_are_not_sessions_give_one_clear_line(tmp_path, content, expected):
    path = tmp_path / "bad.tmsession"
    path.write_bytes(content)
    with pytest.raises(RecordError, match=expected):
        load(path)
    proc = _torchmem("report", str(path))
    assert proc.returncode == 2
    assert expected in proc.stderr and "Traceback" not in proc.stderr


def test_another_programs_database_and_a_newer_schema_are_named_as_such(tmp_path):
    foreign = tmp_path / "other.db"
    sqlite3.connect(foreign).execute("CREATE TABLE x (y)").connection.close()
    with pytest.raises(RecordError, match="another program"):
        load(foreign)
    newer = tmp_path / "newer.tmsession"
    start_recording(newer, Session(), "run", None).close()
    conn = sqlite3.connect(newer)
    conn.execute("PRAGMA user_version=99")
    conn.close()
    with pytest.raises(RecordError, match="newer torchmem"):
        load(newer)
    with pytest.raises(RecordError, match="no such session"):
        load(tmp_path / "missing.tmsession")


def test_a_truncated_file_reports_what_it_could_read(tmp_path):
    path = tmp_path / "cut.tmsession"
    live = Session()
    recorder = start_recording(path, live, "run", "/x/train.py")
    for i in range(3000):
        live.submit(Sample(i * 0.1, {"cpu/rss": float(i), "cpu/uss": float(i)}))
    recorder.close()
    size = path.stat().st_size
    with path.open("r+b") as handle:
        handle.truncate(size // 2)
    try:
        recording = load(path)
    except RecordError as exc:  # SQLite may refuse the file outright: still a clear line
        assert "cut.tmsession is a torchmem session" in str(exc) and "damaged" in str(exc)
        return
    assert recording.problems, "a damaged file never reads as a whole one"
    assert recording.session.samples < 3000


@pytest.mark.slow
def test_a_session_cut_short_where_sqlite_refuses_it_is_called_damaged_not_foreign(tmp_path):
    """A copy that did not finish: SQLite refuses the file, yet its header still says it
    is a torchmem session, and the message says so instead of "not a torchmem session"."""
    path = tmp_path / "copy.tmsession"
    live = Session()
    recorder = start_recording(path, live, "run", "/x/train.py")
    _play_run(live)
    recorder.close()
    whole = path.read_bytes()
    for size in (4096, len(whole) // 2):
        path.write_bytes(whole[:size])
        try:
            recording = load(path)
        except RecordError as exc:
            assert "is a torchmem session" in str(exc) and "too damaged" in str(exc)
            proc = _torchmem("report", str(path))
            assert proc.returncode == 2 and "too damaged to read" in proc.stderr
        else:
            assert recording.problems
    (tmp_path / "other.db").write_bytes(b"SQLite format 3\x00" + bytes(4000))
    with pytest.raises(RecordError, match="not a torchmem session"):
        load(tmp_path / "other.db")


@pytest.mark.slow
def test_kill_9_of_a_recorded_run_loses_at_most_the_last_second(tmp_path):
    path = tmp_path / "killed.tmsession"
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchmem", "run", "--record", str(path),
         str(SCRIPTS / "train_forever.py")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "training"
        # Wait until the recording holds a few seconds of samples, read as any reader would.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                with SessionFile(path) as file:
                    if file.span()[1] > 3.0:
                        break
            except RecordError:
                pass
            time.sleep(0.2)
        killed_at = time.time()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    recording = load(path)
    assert not recording.complete
    last_wall = recording.wall_time(recording.last_t).timestamp()
    # 10 Hz samples, commits at least every 0.5 s: the newest kept is under a second old.
    assert last_wall >= killed_at - 1.0, f"lost {killed_at - last_wall:.2f} s"
    report = _torchmem("report", "--json", str(path))
    assert report.returncode == 0, report.stderr
    data = check_summary(json.loads(report.stdout))
    assert data["status"] == "killed or crashed"
    assert data["recording"]["complete"] is False
    assert data["samples"] == recording.session.samples > 5
    _reads_the_same_where_it_cannot_write(path, data)


def _reads_the_same_where_it_cannot_write(path: Path, expected: dict) -> None:
    """The killed run's file, WAL and all, in a folder its reader cannot write (a shared
    results folder): SQLite cannot create the WAL's index there, yet the report is the
    same, and nothing is written beside the file. As root, the reader runs without the
    capabilities that let root write anywhere."""
    assert path.with_name(path.name + "-wal").exists(), "a killed recording leaves its WAL"
    shared = Path(tempfile.mkdtemp(prefix="tm-shared-"))
    try:
        for suffix in ("", "-wal"):
            copy = shared / (path.name + suffix)
            shutil.copyfile(path.with_name(path.name + suffix), copy)
            copy.chmod(0o444)
        shared.chmod(0o555)
        before = sorted(p.name for p in shared.iterdir())
        home = Path(tempfile.mkdtemp(prefix="tm-home-"))
        home.chmod(0o777)
        prefix: list[str] = []
        if os.geteuid() == 0:  # root writes anywhere: the reader runs without that power
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                pytest.skip("as root, setpriv (util-linux) is needed to read without writing")
            prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search,-fowner",
                      "--inh-caps=-all", "--"]  # fmt: skip
        done = subprocess.run(
            [*prefix, sys.executable, "-m", "torchmem", "report", "--json",
             str(shared / path.name)],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home),
                 "XDG_DATA_HOME": str(home), "TMPDIR": str(home)},
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        data = json.loads(done.stdout)
        assert data["samples"] == expected["samples"] and data["steps"] == expected["steps"]
        assert sorted(p.name for p in shared.iterdir()) == before, "nothing written beside it"
        assert not list(home.glob("torchmem-session-*")), "the private copy is removed"
    finally:
        shared.chmod(0o755)
        shutil.rmtree(shared, ignore_errors=True)


@pytest.mark.slow
def test_record_report_and_sessions_from_the_command_line(tmp_path):
    path = tmp_path / "ok.tmsession"
    run = _torchmem("run", "--record", str(path), str(SCRIPTS / "train_steps.py"))
    assert run.returncode == 0, run.stderr
    assert f"recorded in {path}" in run.stderr
    report = _torchmem("report", str(path), "--csv", str(tmp_path / "s.csv"))
    assert report.returncode == 0, report.stderr
    assert "finished (exit code 0)" in report.stdout
    rows = (tmp_path / "s.csv").read_text().splitlines()
    header = rows[0].split(",")
    assert header[:3] == ["t_s", "unix_time", "step"] and "cpu/rss" in header
    assert len(rows) - 1 == load(path).session.samples
    listing = _torchmem("sessions", "--dir", str(tmp_path))
    assert "train_steps.py" in listing.stdout and "finished" in listing.stdout
    again = _torchmem("run", "--record", str(path), str(SCRIPTS / "train_steps.py"))
    assert again.returncode == 2 and "already exists" in again.stderr


def test_the_folder_keeps_the_newest_sessions_under_its_cap(tmp_path):
    paths = []
    for i in range(4):
        live = Session()
        path = library.new_session_path(f"run{i}.py", tmp_path)
        recorder = start_recording(path, live, "run", f"run{i}.py")
        for j in range(200):
            live.submit(Sample(j * 0.1, {"cpu/rss": float(j)}))
        recorder.close()
        os.utime(path, (1000 + i, 1000 + i))
        paths.append(path)
    sizes = [library.file_bytes(p) for p in paths]
    deleted = library.prune(tmp_path, cap_bytes=sum(sizes[2:]), keep=(paths[0],))
    assert deleted == [paths[1]] or deleted == [paths[1], paths[2]]
    assert paths[0].exists() and paths[3].exists()
    listed = [e.path for e in library.list_sessions(tmp_path)]
    assert listed[0] == paths[3]


def _torchmem(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchmem", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_loop_of_tiny_steps_is_recorded_thinned_with_its_step_count_and_time_exact(tmp_path):
    live = Session()
    path = tmp_path / "tiny.tmsession"
    recorder = start_recording(path, live, "run", "tiny.py")
    for step in range(1, 10_001):  # 10,000 steps of 0.1 ms each
        live.submit(Marker(step * 1e-4, MarkerKind.STEP, step=step))
    recorder.close()
    with SessionFile(path) as file:
        markers = file.conn.execute("SELECT count(*) FROM events WHERE kind = 'Marker:step'")
        assert markers.fetchone()[0] <= 1 / 0.05 + 2
    again = load(path).session
    assert again.steps.steps == 10_000
    assert step_time(again) == pytest.approx(step_time(live)) == pytest.approx(1e-4)


def _recorded(path: Path, rss_per_step: float, steps: int, step_s: float) -> Path:
    live = Session()
    recorder = start_recording(path, live, "run", f"/x/{path.stem}.py")
    live.submit(RunStarted(0.0, f"/x/{path.stem}.py", ()))
    for step in range(1, steps + 1):
        t = step * step_s
        live.submit(Sample(t, {"cpu/rss": 1e8 + step * rss_per_step}))
        live.submit(Marker(t, MarkerKind.STEP, step=step))
    live.submit(
        RunFinished(steps * step_s, RunStatus.FINISHED, 0, "finished", duration_s=steps * step_s)
    )
    recorder.close()
    return path


@pytest.mark.slow
def test_two_runs_compare_step_by_step_and_in_a_table(tmp_path):
    from torchmem.record.compare import aligned, common_keys, compare_row

    before = load(_recorded(tmp_path / "before.tmsession", 2e6, 50, 0.1))
    after = load(_recorded(tmp_path / "after.tmsession", 1e6, 50, 0.2))
    assert common_keys([before, after]) == ["cpu/rss"]
    # Aligned by step, the runs' readings at step 40 line up although their times differ.
    for recording, per_step in ((before, 2e6), (after, 1e6)):
        x, v = aligned(recording, "cpu/rss", "steps")
        assert v[list(x).index(40.0)] == 1e8 + 40 * per_step
    rows = [compare_row(r, recorded_summary(r)) for r in (before, after)]
    assert [r.name for r in rows] == ["before.py", "after.py"]
    assert rows[0].peaks["cpu_rss"] == 1e8 + 50 * 2e6 and rows[1].peaks["cpu_rss"] == 1.5e8
    assert rows[1].step_time_s == pytest.approx(2 * rows[0].step_time_s)

    proc = _torchmem("compare", str(before.path), str(after.path))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("before.py") and lines[2].startswith("after.py")
    assert "-25%" in lines[2], "the second run's peak reads as a change from the first"
    bad = _torchmem("compare", str(before.path), str(tmp_path / "nope.tmsession"))
    assert bad.returncode == 2 and "no such session file" in bad.stderr


def test_a_run_that_vanished_when_ram_ran_out_is_blamed_on_the_oom_killer(tmp_path):
    from torchmem.sources.vanished import oom_killer_hint

    total = 16 * 2**30
    starving, fine = Session(), Session()
    path = tmp_path / "starved.tmsession"
    recorder = start_recording(path, starving, "run", "big.py")
    starving.submit(RunStarted(0.0, "big.py", ()))
    for i in range(30):
        t = i * 0.1
        available = 8 * 2**30 - i * 280 * 2**20  # 72 MiB left at the end
        starving.submit(Sample(t, {"system/available": available, "cpu/rss": 1e9 + i * 3e8}))
        fine.submit(Sample(t, {"system/available": 8 * 2**30, "cpu/rss": 1e9}))
    hint = oom_killer_hint(starving, total)
    assert "probably the kernel's OOM killer" in hint and "of 16.00 GiB" in hint
    assert "72.00 MiB" in hint
    assert oom_killer_hint(fine, total) == ""
    # One rank of a job: its own readings, under its prefix.
    job = Session()
    for i in range(30):
        values = {"system/available": 8 * 2**30 - i * 280 * 2**20, "cpu/rss": 1e9 + i * 3e8}
        job.submit(Sample(i * 0.1, values, scope="rank1"))
    assert oom_killer_hint(job, total) == ""
    assert "72.00 MiB" in oom_killer_hint(job, total, scope="rank1")
    # The recording stops there (the monitor was killed too): its report says why, likely.
    recorder.close({"complete": False})
    message = recorded_summary(load(path))["message"]
    assert "without its end" in message and "probably the kernel's OOM killer" in message


def test_a_cuda_oom_report_reads_the_message_and_the_fragmentation(tmp_path):
    from torchmem.leaks.oom import explain_oom

    session = Session()
    recorder = start_recording(tmp_path / "oom.tmsession", session, "run", "train.py")
    session.submit(RunStarted(0.0, "train.py", ()))
    # The device's total becomes known once the script has initialised CUDA, mid-run.
    session.submit(CapacityKnown(0.5, {"cpu": 16 * 2**30, "cuda:1": 80 * 2**30}))
    session.submit(Sample(1.0, {"cuda:1/allocated": 60 * 2**30, "cuda:1/reserved": 75 * 2**30}))
    error = (
        "out of memory (OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 "
        "has a total capacity of 79.15 GiB of which 1.50 GiB is free.). Try a smaller batch "
        "size, activation checkpointing, or mixed precision; on CUDA, ..."
    )
    session.submit(RunFinished(2.0, RunStatus.OOM, 1, error))
    report = explain_oom(session)
    assert report.device == "cuda:1" and report.requested_bytes == 2 * 2**30
    assert report.capacity_bytes == 80 * 2**30
    assert report.unallocated_reserved == 15 * 2**30
    keys = [s.key for s in report.suggestions]
    assert keys[0] == "tune" and "expandable_segments" in keys
    assert any("15.00 GiB reserved but unallocated" in line for line in report.lines())
    # The recording keeps the total: its report says it, as the live run did.
    recorder.close()
    data = check_summary(recorded_summary(load(tmp_path / "oom.tmsession")))
    assert data["capacity_bytes"]["cuda:1"] == 80 * 2**30
    assert data["oom"]["device"] == "cuda:1"
    fine = Session()
    fine.submit(RunFinished(1.0, RunStatus.FINISHED, 0, "finished"))
    assert explain_oom(fine) is None


@pytest.mark.slow
def test_an_oom_run_explains_itself_in_its_summary_and_its_recording(tmp_path):
    script = SCRIPTS / "oom_in_forward.py"
    path, summary = tmp_path / "oom.tmsession", tmp_path / "s.json"
    run = _torchmem("run", "--record", str(path), "--summary", str(summary), str(script))
    assert run.returncode == 1
    assert "largest storages when it failed" in run.stderr and "hidden (activation)" in run.stderr
    data = check_summary(json.loads(summary.read_text()))
    assert data["status"] == "out of memory"
    assert data["oom"]["largest"][0]["name"] == "hidden"
    assert data["oom"]["requested_bytes"] == 1 << 50
    report = _torchmem("report", "--json", str(path))
    again = check_summary(json.loads(report.stdout))
    assert again["oom"]["largest"] == data["oom"]["largest"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", ""),
        (
            " expandable_segments:True , max_split_size_mb:128 ",
            "expandable_segments:True,max_split_size_mb:128",
        ),
        ("garbage_collection_threshold:0.8", "garbage_collection_threshold:0.8"),
        ("expandable_segment:True", "unknown setting 'expandable_segment'"),
        ("max_split_size_mb:10", "max_split_size_mb must be"),
        ("garbage_collection_threshold:2", "garbage_collection_threshold must be"),
        ("expandable_segments", "is not key:value"),
    ],
)
def test_allocator_settings_are_checked_before_a_run(text, expected):
    from torchmem.probe.allocator import check_allocator_conf

    try:
        assert check_allocator_conf(text) == expected
    except ValueError as exc:
        assert expected in str(exc)


@pytest.mark.slow
def test_two_censuses_of_a_recorded_run_diff_by_name(tmp_path):
    from torchmem.record.census_diff import diff_by_name, recorded_censuses

    path = tmp_path / "leaky.tmsession"
    live = Session()
    recorder = start_recording(path, live, "run", "leaky.py")
    first = {"model.fc.weight": [4096], "batch": [1024], "history[*]": [100] * 2}
    second = {"model.fc.weight": [4096], "batch": [1024], "history[*]": [100] * 12, "cache": [512]}
    live.submit(CensusTaken(1.0, 10, census_of(first, 10), "step"))
    live.submit(CensusTaken(2.0, 20, census_of(second, 20), "step"))
    recorder.close()
    taken = recorded_censuses(path)
    assert [t.step for t in taken] == [10, 20]
    rows = diff_by_name(taken[0].census, taken[1].census)
    # Reallocated at new addresses, batch and the weight are no change by name.
    assert [(r.name, r.change, r.delta, r.count_after) for r in rows] == [
        ("history[*]", "grown", 1000, 12),
        ("cache", "new", 512, 1),
    ]
    listing = _torchmem("report", "--censuses", str(path))
    assert listing.returncode == 0 and len(listing.stdout.splitlines()) == 3
    diff = _torchmem("report", "--diff", "1", "2", str(path))
    assert diff.returncode == 0, diff.stderr
    assert "  grown     +1,000 B  history[*] x12" in diff.stdout
    assert "    new       +512 B  cache" in diff.stdout
    wrong = _torchmem("report", "--diff", "1", "3", str(path))
    assert wrong.returncode == 2 and "holds censuses 1 to 2" in wrong.stderr


@pytest.mark.slow
def test_a_jobs_censuses_reopen_as_each_ranks_old_files_included(tmp_path):
    """A job's censuses say which rank took them. This version records the rank as the
    census's scope; files of earlier versions named the rank in every device
    (``rank1/cpu``): both reopen as a live census comes, devices under their own names."""
    from dataclasses import replace

    from torchmem.record.census_diff import recorded_censuses

    def prefixed(census, prefix):  # how earlier versions recorded a rank's census
        storages = {}
        for (device, ptr), storage in census.storages.items():
            key = (prefix + device, ptr)
            tensors = [
                replace(t, device=prefix + t.device, storage_key=key) for t in storage.tensors
            ]
            storages[key] = StorageInfo(key, storage.nbytes, tensors)
        return replace(census, storages=storages)

    path = tmp_path / "job.tmsession"
    live = Session()
    recorder = start_recording(path, live, "attach", "ddp.py")
    live.submit(CensusTaken(1.0, 1, census_of({"rank_buffer": [1024]}, 1), "user", "rank0"))
    live.submit(CensusTaken(2.0, 1, prefixed(census_of({"rank_buffer": [2048]}, 1), "rank1/")))
    live.submit(CensusTaken(3.0, 2, census_of({"weights": [512]}, 2)))  # a lone process's
    recorder.close()
    taken = recorded_censuses(path)
    assert [(t.scope, t.census.devices(), t.census.total_bytes()) for t in taken] == [
        ("rank0", ["cpu"], 1024),
        ("rank1", ["cpu"], 2048),
        ("", ["cpu"], 512),
    ]
    (tensor,) = taken[1].census.tensors()
    assert tensor.device == "cpu" and tensor.storage_key[0] == "cpu"
    again = Session()
    for event in taken:
        again.submit(event)
    assert again.censuses("rank1")[0].census.total_bytes() == 2048
    assert [list(by) for _, _, by in again.breakdown()] == [
        [("rank0", "cpu")],
        [("rank1", "cpu")],
        [("", "cpu")],
    ]
    listing = _torchmem("report", "--censuses", str(path))
    assert listing.returncode == 0, listing.stderr
    whys = [line.split("  ")[-1] for line in listing.stdout.splitlines()[1:]]
    assert whys == ["user (rank 0)", "user (rank 1)", "user"]


def test_a_long_recording_reopens_from_its_overview_with_the_same_figures(tmp_path, monkeypatch):
    from torchmem.record import replay

    path = tmp_path / "long.tmsession"
    live = Session()
    recorder = start_recording(path, live, "run", "long.py")
    live.submit(RunStarted(0.0, "long.py", ()))
    for i in range(20_000):  # a long run, in miniature
        t = i * 0.1
        live.submit(Sample(t, {"cpu/rss": 1e8 + (i % 997) * 1e5 + (5e8 if i == 4321 else 0)}))
        live.submit(Marker(t, MarkerKind.STEP, step=i + 1))
        if i % 50 == 0:
            live.submit(LogRecord(t, Stream.STDOUT, f"step {i}"))
    live.submit(Marker(10.0, MarkerKind.EPOCH, "epoch 2", 100))
    live.submit(RunFinished(2000.0, RunStatus.FINISHED, 0, "finished", duration_s=2000.0))
    recorder.close()
    full = load(path).session
    monkeypatch.setattr(replay, "OVERVIEW_ABOVE", 1_000)
    quick = load(path).session
    assert quick.samples == full.samples == 20_000
    # The one spike, long folded into a bucket, survives as the peak.
    assert quick.peak_bytes() == full.peak_bytes() == {"cpu_rss": 1e8 + 333 * 1e5 + 5e8}
    assert quick.steps.steps == full.steps.steps == 20_000
    assert quick.latest()["cpu/rss"] == full.latest()["cpu/rss"]
    assert [m.label for m in quick.user_markers()] == ["epoch 2"]
    assert quick.run_finished.status is RunStatus.FINISHED
    assert [r.text for r in quick.logs][-1] == "step 19950"
    # The recent window is exact: the last 6000 readings at full rate.
    t_full, v_full = full.arrays("cpu/rss")
    t_quick, v_quick = quick.arrays("cpu/rss")
    assert t_quick[-6000:].tolist() == t_full[-6000:].tolist()
    assert v_quick[-6000:].tolist() == v_full[-6000:].tolist()


def test_a_recorded_job_reopens_with_the_totals_it_had_live(tmp_path, monkeypatch):
    """The file holds the ranks' samples and who the job's members were; reopening derives
    the totals again, event by event and from a long run's overview alike."""
    from torchmem.record import replay

    path = tmp_path / "job.tmsession"
    live = Session()
    recorder = start_recording(path, live, "attach", "train.py")
    live.submit(RunStarted(0.0, "train.py", ()))
    nodes = {"rank0": "@a", "rank1": "@a", "rank2": "@b"}
    live.submit(JobMembers(0.0, tuple(nodes), nodes))
    for i in range(3_000):
        rank = i % 3
        live.submit(Sample(i * 0.1, {"cpu/rss": 1e8 * (rank + 1) + i * 1e4}, scope=f"rank{rank}"))
        if i == 2_000:  # rank 1 ended: the totals go on without it
            live.submit(JobMembers(0.0, tuple(nodes), nodes, ended=("rank1",)))
    recorder.close()
    full = load(path).session
    monkeypatch.setattr(replay, "OVERVIEW_ABOVE", 1_000)
    quick = load(path).session
    totals = ("total/cpu/rss", "@a/cpu/rss", "@b/cpu/rss")
    for reopened in (full, quick):
        assert (
            reopened.scopes() == live.scopes() == ["rank0", "rank1", "rank2", "@a", "@b", "total"]
        )
        for key in totals:
            assert reopened.latest()[key] == live.latest()[key], key
    assert live.latest()["total/cpu/rss"][0] == 1e8 + 3e8 + (2_997 + 2_999) * 1e4
    t_live, v_live = live.arrays("total/cpu/rss")
    t_full, v_full = full.arrays("total/cpu/rss")
    assert t_full.tolist() == t_live.tolist() and v_full.tolist() == v_live.tolist()


@pytest.mark.slow
def test_memory_snapshots_taken_during_a_run_are_listed_by_its_report(tmp_path):
    from torchmem.events import CommandResult

    path = tmp_path / "snap.tmsession"
    here = tmp_path / "snapshot-2.pickle"
    here.write_bytes(b"a snapshot")
    live = Session()
    recorder = start_recording(path, live, "run", "train.py")
    live.submit(RunStarted(0.0, "train.py", ()))
    live.submit(Sample(0.5, {"cpu/rss": 1e8}, None))
    live.submit(CommandResult(1.0, "snapshot", True, "written", output="/data/snapshot-1.pickle"))
    live.submit(CommandResult(2.0, "snapshot", False, "no history"))
    live.submit(CommandResult(3.0, "snapshot", True, "written", output=str(here)))
    recorder.close()
    data = check_summary(recorded_summary(load(path)))
    assert data["snapshots"] == ["/data/snapshot-1.pickle", str(here)]

    # --export: everything in one folder; a snapshot of another machine is said, not fatal.
    out = tmp_path / "export"
    done = _torchmem("report", "--export", str(out), str(path))
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "samples.csv", "snapshot-2.pickle", "summary.json",
    ]  # fmt: skip
    assert (out / "snapshot-2.pickle").read_bytes() == b"a snapshot"
    assert json.loads((out / "summary.json").read_text())["snapshots"] == data["snapshots"]
    assert "cpu/rss" in (out / "samples.csv").read_text().splitlines()[0]
    assert "/data/snapshot-1.pickle is not on this machine" in done.stderr
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    refused = _torchmem("report", "--export", str(blocked / "x"), str(path))
    # Checked before anything is read or written: one line, exit 2.
    assert refused.returncode == 2 and f"{blocked} is a file, not a folder" in refused.stderr


def test_a_long_run_cut_short_reopens_with_the_samples_after_its_last_overview(
    tmp_path, monkeypatch
):
    from torchmem.record import overview, replay

    monkeypatch.setattr(overview, "EVERY_S", 0.0)  # an overview at every commit
    path = tmp_path / "cut.tmsession"
    live = Session()
    recorder = start_recording(path, live, "run", "long.py")
    for i in range(5_000):
        live.submit(Sample(i * 0.1, {"cpu/rss": 1e8 + i}))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until an overview holds the first part
        with SessionFile(path) as file:
            if (file.span()[0] or 0) >= 5_000:
                break
    # From here on no overview is written, as after a kill -9 between two of them.
    monkeypatch.setattr(overview.OverviewBuilder, "write", lambda self, conn: None)
    for i in range(5_000, 8_000):
        live.submit(Sample(i * 0.1, {"cpu/rss": 3e8 if i == 7_000 else 1e8 + i}))
    recorder.close({"complete": False})
    monkeypatch.setattr(replay, "OVERVIEW_ABOVE", 1_000)
    quick = load(path).session
    assert quick.samples == 8_000
    assert quick.peak_bytes() == {"cpu_rss": 3e8}, "the spike after the last overview"
    assert quick.latest()["cpu/rss"][0] == 1e8 + 7_999


def test_a_run_stopped_by_max_steps_reads_back_as_the_command_line_ended_it(tmp_path):
    path = tmp_path / "quick.tmsession"
    live = Session()
    recorder = start_recording(path, live, "run", "train.py")
    live.submit(RunStarted(0.0, "train.py", ()))
    live.submit(RunFinished(1.0, RunStatus.STOPPED, 143, "stopped by the user at step 5"))
    message = "stopped after 5 steps (--max-steps)"
    recorder.close({"summary": {"status": "finished", "exit_code": 0, "message": message}})
    data = check_summary(recorded_summary(load(path)))
    assert (data["status"], data["exit_code"], data["message"]) == ("finished", 0, message)


def test_between_runs_the_recorder_keeps_only_the_newest_census_for_the_next_file(tmp_path):
    """Readings before a run's start go into its file; of the censuses taken meanwhile
    (each can be megabytes), only the newest: an idle window does not hoard them."""
    from torchmem.record.census_diff import recorded_censuses
    from torchmem.record.runs import RunRecorder

    live = Session()
    runs = RunRecorder(live, tmp_path)
    for i in range(50):
        live.submit(Sample(float(i), {"cpu/rss": 1e9 + i}))
        live.submit(CensusTaken(float(i), i, census_of({"weights": [4096]}, i), "user"))
    live.submit(RunStarted(50.0, "train.py", ()))
    live.submit(CensusTaken(51.0, 51, census_of({"weights": [4096]}, 51), "step"))
    runs.end_run()
    runs.close()
    (path,) = tmp_path.glob("*.tmsession")
    assert [t.step for t in recorded_censuses(path)] == [49, 51]
    assert load(path).session.samples == 50


def test_a_run_that_ended_as_the_window_closed_lists_with_its_end_peak_and_alerts(tmp_path):
    """The window closed between a run's end and its own word that the run was over: the
    file listed as "interrupted" with no peak and no alerts, while its report read the
    run's end, its peak and its leak alert from the events."""
    from torchmem.record.library import list_sessions
    from torchmem.record.runs import RunRecorder
    from torchmem.report.summary import run_summary

    live = Session()
    runs = RunRecorder(live, tmp_path, summarize=run_summary)
    live.submit(RunStarted(0.0, "train.py", ()))
    live.submit(Sample(0.5, {"cpu/rss": 1 << 30}))
    live.submit(RunFinished(1.0, RunStatus.STOPPED, 130, "stopped by the user at step 137"))
    runs.close()  # no end_run: the window was closing
    (entry,) = list_sessions(tmp_path)
    assert entry.status == "stopped" and entry.peak_bytes == 1 << 30
