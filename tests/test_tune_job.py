"""``torchmem tune -- torchrun ...``: the per-rank batch of a distributed job, so that
every rank fits; trials of real two-rank gloo jobs, and a job's summary judged as a trial."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest
from helpers import check_summary

from torchmem.cli.launch import job_outcome
from torchmem.tuning.trial import (
    TrialPlan,
    measured_trial,
    run_trial,
    torchrun_command,
    worst_rank_peak,
)

SCRIPTS = Path(__file__).parent / "scripts"
DDP = str(SCRIPTS / "ddp_train.py")
MiB, GiB = 1 << 20, 1 << 30
PER_SAMPLE = 4  # MiB each rank holds per sample of its batch (ddp_train --mib-per-sample)


#: Set to a fresh value in a test's environment, which its jobs' ranks inherit.
TAG_ENV = "TORCHMEM_TEST_JOB"


@pytest.fixture
def job_tag(monkeypatch) -> str:
    """A tag that the ranks of this test's jobs carry in their environment."""
    tag = uuid.uuid4().hex
    monkeypatch.setenv(TAG_ENV, tag)
    return tag


def leftover_ranks(tag: str) -> list[psutil.Process]:
    """This test's ranks of ddp_train.py still alive (a trial must leave none). Other
    tests' jobs may run beside it, on the other test worker: they have another tag."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if not any(arg.endswith("ddp_train.py") for arg in cmdline):
            continue
        try:
            if proc.environ().get(TAG_ENV) == tag:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.mark.slow
def test_a_two_rank_job_gets_a_per_rank_batch_that_fits_every_rank(tmp_path, job_tag):
    out = tmp_path / "tune.json"
    r = subprocess.run(
        [sys.executable, "-m", "torchmem", "tune", "--budget", "2GiB", "--summary", str(out),
         "--", *torchrun_command(2, DDP, ["--sleep", "0", "--mib-per-sample", str(PER_SAMPLE)])],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    data = check_summary(json.loads(out.read_text()))
    trials = data["trials"]
    assert data["command"][:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert all(t["ranks"] == 2 and t["ok"] for t in trials), trials
    # Six trials (4 probes, the verify and its repeat) when the ranks' RSS agrees; where
    # it scatters more (a loaded machine), the search repeats the answer until it is
    # known to 3% (and runs a size that moves it once): those runs, no probe, come on top.
    roles = [(t["batch_size"], t["role"]) for t in trials]
    assert data["ooms"] == 0 and len(trials) <= 8, roles
    assert all(role in ("repeat", "confirm") for _, role in roles[6:]), roles
    # Both ranks share the machine's RAM: each sample of the per-rank batch costs twice
    # what one rank holds for it.
    assert data["fit"]["slope"] == pytest.approx(2 * PER_SAMPLE * MiB, rel=0.1)
    # Everything but the batch, from the smallest trial; the largest batch under the limit.
    first = trials[0]
    base = first["peak_bytes"] - first["batch_size"] * 2 * PER_SAMPLE * MiB
    true_max = (data["limit_bytes"] - base) // (2 * PER_SAMPLE * MiB)
    assert 0.85 * true_max <= data["recommended"] <= true_max + 1, (data["recommended"], true_max)
    verified = [t for t in trials if t["batch_size"] == data["recommended"]]
    assert verified and verified[0]["peak_bytes"] <= data["limit_bytes"]
    # The rate is the job's: both ranks' samples.
    assert verified[0]["samples_per_s"] > 0
    assert "every rank on this machine together" in r.stderr
    last = r.stderr.splitlines()[-1]
    assert "torch.distributed.run --nproc_per_node=2" in last
    assert last.endswith(f"--batch-size {data['recommended']}")
    assert not leftover_ranks(job_tag)


@pytest.mark.slow
def test_a_job_trial_over_the_budget_is_stopped_with_every_rank(job_tag):
    launch = torchrun_command(2, DDP, ["--sleep", "0", "--mib-per-sample", "64", "--steps", "50"])
    plan = TrialPlan(launch[0], tuple(launch[1:]), "--batch-size", budget_bytes=int(1.2 * GiB),
                     job=True)  # fmt: skip
    started = time.monotonic()
    trial = run_trial(plan, 8)  # 2 ranks x 512 MiB of activations: over 1.2 GiB together
    assert trial.oom and not trial.ok, trial
    assert "crossed the budget" in trial.message
    assert trial.peak_bytes > plan.budget_bytes
    assert time.monotonic() - started < 60
    assert not leftover_ranks(job_tag), "a rank of the stopped job is still running"


def rank(n, run_status="finished", message="stopped after 4 steps (--max-steps)", step=0.1,
         peaks=None, reserved=None):  # fmt: skip
    return {"pid": 100 + n, "rank": n, "world_size": 2, "status": "finished", "ended": True,
            "host": None, "run_status": run_status, "exit_code": 0, "message": message,
            "steps": 4, "step_time_s": step, "peak_bytes": peaks or {},
            "peak_reserved_bytes": reserved or {}}  # fmt: skip


def test_a_job_summary_takes_its_slowest_rank_and_its_first_failure():
    assert job_outcome([rank(0, step=0.1), rank(1, step=0.3)]) == {"steps": 4, "step_time_s": 0.3}
    failed = job_outcome([rank(0), rank(1, "out of memory", "CUDA out of memory. Tried ...")])
    assert failed["status"] == "out of memory"
    assert failed["message"] == "rank 1: CUDA out of memory. Tried ..."
    assert job_outcome([]) == {}


def test_a_rank_out_of_memory_is_an_oom_trial_and_the_fullest_rank_counts():
    # Never run on a GPU here: the per-rank CUDA figures of a job summary as a stub.
    plan = TrialPlan("torchrun", ("train.py",), "--batch-size", device="cuda:0",
                     budget_bytes=80 * GiB, job=True)  # fmt: skip
    ranks = [rank(0, peaks={"cuda:0": 10 * GiB}, reserved={"cuda:0": 11 * GiB}),
             rank(1, peaks={"cuda:1": 12 * GiB, "cpu_rss": 20 * GiB},
                  reserved={"cuda:1": 14 * GiB})]  # fmt: skip
    assert worst_rank_peak(ranks, "peak_reserved_bytes", "cuda:0") == 14 * GiB
    # The job's sums (22 GiB on no one device) are the summary's, never a rank's.
    summary = {"steps": 4, "peak_bytes": {"total/cuda:0": 22 * GiB},
               "peak_reserved_bytes": {"total/cuda:0": 25 * GiB},
               "ranks": ranks, "step_time_s": 0.5}  # fmt: skip
    trial = measured_trial(plan, 32, 0, 0, None, summary, "", 9.0)
    assert trial.ok and trial.peak_bytes == 14 * GiB and trial.peak_allocated_bytes == 12 * GiB
    assert trial.samples_per_s == pytest.approx(2 * 32 / 0.5)  # both ranks' samples
    summary.update(job_outcome([rank(0), rank(1, "out of memory", "CUDA out of memory")]))
    trial = measured_trial(plan, 64, 1, 0, None, summary, "", 9.0)
    assert trial.oom and trial.message == "rank 1: CUDA out of memory"


def failed_job_trial(stderr, seconds):
    """The trial of a 2-rank job that exited with code 1 after ``seconds``, no rank
    reporting a failure, its launcher having printed ``stderr``."""
    plan = TrialPlan("torchrun", ("train.py",), "--batch-size", budget_bytes=1 << 30, job=True)
    return measured_trial(plan, 4, 1, 1 << 28, None, {"ranks": [{}, {}]}, stderr, seconds)


def test_a_job_that_fails_in_its_launcher_says_the_launchers_error():
    """No rank reports a failure, torchrun exits 1: the message carries its error line,
    not only "exited with code 1"."""
    stderr = (
        "Traceback (most recent call last):\n"
        '  File "elastic/agent/server/api.py", line 900, in _invoke_run\n'
        "torch.distributed.elastic.rendezvous.api.RendezvousClosedError: the store closed\n"
        "torchmem: torchrun… exited with code 1 after 3.1 s; 2 processes with torch\n"
    )
    trial = failed_job_trial(stderr, 3.1)
    assert not trial.ok and not trial.oom
    assert "exited with code 1" in trial.message and "RendezvousClosedError" in trial.message


def test_a_rank_that_dies_is_named_by_its_exception_not_by_torchruns_report():
    # A CI run's trial failed with only "(error_file: <N/A>)", the last line of torchrun's
    # failure report with "error" in it; the rank's own exception came before the report.
    stderr = (
        "[rank1]: RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer\n"
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "Root Cause (first observed failure):\n"
        "  exitcode  : 1 (pid: 4242)\n"
        "  error_file: <N/A>\n"
        "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html\n"
        "torchmem: torchrun… exited with code 1 after 3.7 s; 2 processes with torch\n"
    )
    trial = failed_job_trial(stderr, 3.7)
    assert "Connection closed by peer" in trial.message, trial.message
    assert "error_file" not in trial.message and "exited with code 1" in trial.message


#: torchrun's output when rank 1 died of a signal after its last step, as a CI trial
#: showed it: no exception line, and a traceback frame whose path says "errors".
ABORTED_AT_EXIT = (
    "E1207 22:31:05.412000 4040 torch/distributed/elastic/multiprocessing/api.py:874] "
    "failed (exitcode: -6) local_rank: 1 (pid: 4243) of binary: /usr/bin/python\n"
    "Traceback (most recent call last):\n"
    '  File "/venv/lib/python3.11/site-packages/torch/distributed/elastic/multiprocessing/'
    'errors/__init__.py", line 367, in wrapper\n'
    "    return f(*args, **kwargs)\n"
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
    "Root Cause (first observed failure):\n"
    "[0]:\n"
    "  rank      : 1 (local_rank: 1)\n"
    "  exitcode  : -6 (pid: 4243)\n"
    "  error_file: <N/A>\n"
    "torchmem: torchrun… exited with code 1 after 8.9 s; 2 processes with torch\n"
)


def test_a_rank_ended_by_a_signal_is_named_with_it_not_by_a_traceback_frame():
    trial = failed_job_trial(ABORTED_AT_EXIT, 8.9)
    assert not trial.ok and "rank 1 was ended by SIGABRT" in trial.message, trial.message
    assert "__init__.py" not in trial.message


def test_a_job_that_fails_at_exit_after_every_rank_measured_its_steps_still_counts():
    """Every rank reported its last step and its end; the launcher's exit code 1 came
    from a rank's teardown: the batch was measured, so the trial counts and says so."""
    plan = TrialPlan("torchrun", ("train.py",), "--batch-size", budget_bytes=4 * GiB, job=True)
    ranks = [rank(0, peaks={"cpu_rss": 400 * MiB}), rank(1, peaks={"cpu_rss": 420 * MiB})]
    summary = {"steps": 4, "ranks": ranks, "step_time_s": 0.2}
    trial = measured_trial(plan, 1, 1, 820 * MiB, None, summary, ABORTED_AT_EXIT, 8.9)
    assert trial.ok and trial.peak_bytes == 820 * MiB
    assert "every rank made its 4 steps" in trial.message
    assert "rank 1 was ended by SIGABRT" in trial.message
    assert "after the measurement" in trial.message
    # A rank that never reported its end may have died mid-step: not measured, a failure.
    unfinished = [ranks[0], rank(1, run_status=None, message=None)]
    summary["ranks"] = unfinished
    trial = measured_trial(plan, 1, 1, 820 * MiB, None, summary, ABORTED_AT_EXIT, 8.9)
    assert not trial.ok and "rank 1 was ended by SIGABRT" in trial.message
    # So may a rank that finished short of the limit (the script ended first).
    short = [ranks[0], {**ranks[1], "steps": 2}]
    summary["ranks"] = short
    assert not measured_trial(plan, 1, 1, 820 * MiB, None, summary, "", 8.9).ok


def test_a_job_whose_script_is_missing_says_so_before_its_exit_code():
    stderr = (
        "/usr/bin/python: can't open file '/work/nosuch.py': [Errno 2] No such file or directory\n"
        "E1207 23:12:14.091000 18290 api.py:1002] failed (exitcode: 2) local_rank: 0 (pid: 18)\n"
        "torchmem: torchrun… exited with code 1 after 1.8 s; 0 processes with torch\n"
    )
    trial = failed_job_trial(stderr, 1.8)
    assert trial.message.startswith("/usr/bin/python: can't open file '/work/nosuch.py'")
    assert "(the job exited with code 1)" in trial.message


def test_the_rank_a_signal_ended_comes_before_the_rank_that_lost_its_peer():
    """Rank 1 was aborted; rank 0 then failed reading from it and reported that. The
    cause is rank 1, which torchrun's report names as its root cause."""
    stderr = (
        "[rank0]: RuntimeError: [pair.cc:537] Read error: Connection reset by peer\n"
        "E1207 23:12:14.091000 18290 api.py:1002] failed (exitcode: -6) local_rank: 1 (pid: 18)\n"
        "Failures:\n[1]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 17)\n"
        "Root Cause (first observed failure):\n[0]:\n"
        "  rank      : 1 (local_rank: 1)\n  exitcode  : -6 (pid: 18)  (SIGABRT)\n"
    )
    plan = TrialPlan("torchrun", ("train.py",), "--batch-size", budget_bytes=1 << 30, job=True)
    lost = "raised RuntimeError: Connection reset by peer"
    summary = {"ranks": [rank(0, "failed", lost), {**rank(1), "run_status": None}],
               "status": "failed", "message": f"rank 0: {lost}"}  # fmt: skip
    trial = measured_trial(plan, 4, 1, 1 << 28, None, summary, stderr, 5.0)
    assert trial.message.startswith("rank 1 was ended by SIGABRT; then rank 0: raised")
    # The rank that failed on its own is named alone.
    own = {**summary, "message": "rank 1: raised ValueError: bad shape"}
    assert measured_trial(plan, 4, 1, 1 << 28, None, own, stderr, 5.0).message == own["message"]
