"""``torchmem run -- COMMAND``: any command, with an agent in every torch process it starts.

After ``--`` comes a command, not a script: ``torchrun --nproc_per_node=2 train.py``, a
shell script, ``python -m pkg``. The command runs with torchmem's startup hook on
PYTHONPATH (see ``resources/autoserve/sitecustomize.py``), so each of its Python processes
that imports torch serves itself, with its rank when torchrun set one. This process
follows the ranks as they appear, for the closing line and ``--summary``, and exits with
the command's exit code.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from torchmem.probe.parent_watch import pdeathsig_preexec
from torchmem.report.summary import build_summary, rank_row, write_summary
from torchmem.resources import path as resource_path
from torchmem.session import Session
from torchmem.sources.attached import AttachedRun
from torchmem.transport.discovery import runtime_dir
from torchmem.units import format_bytes


def hook_dir() -> Path:
    """The folder holding the startup hook (first on the command's PYTHONPATH)."""
    return resource_path("autoserve")


def command_env(hz: float, max_steps: int | None = None) -> dict[str, str]:
    """The command's environment: the hook on PYTHONPATH, where agents register, and the
    step limit of each torch process (``--max-steps``)."""
    env = dict(os.environ)
    env["TORCHMEM_AUTOSERVE"] = "1"
    env["TORCHMEM_HZ"] = f"{hz:g}"
    env.pop("TORCHMEM_MAX_STEPS", None)
    if max_steps:
        env["TORCHMEM_MAX_STEPS"] = str(max_steps)
    env["TORCHMEM_RUNTIME_DIR"] = str(runtime_dir())
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(hook_dir()), env.get("PYTHONPATH", "")) if p
    )
    return env


def run_command(
    command: list[str],
    summary_path: str | None = None,
    hz: float = 10.0,
    quiet: bool = False,
    max_steps: int | None = None,
) -> int:
    """Run ``command`` with agents in its torch processes; return its exit code.

    With ``max_steps``, each torch process of the command exits (code 0) at the end of
    that step: a few steps of every rank of a job (a tuning trial of ``torchmem tune --
    torchrun ...``)."""
    session = Session()
    # Every torch process of the command, attached as it appears, under its scope.
    job = AttachedRun(session, os.getpid(), hz, follow_new=True)
    follower = threading.Thread(
        target=job.follow, kwargs={"close": False}, name="torchmem-ranks", daemon=True
    )
    started = time.monotonic()
    try:
        # The command ends with this process, however it ends (a kill -9, a lost SSH
        # session): a torchrun left behind goes on training with nobody watching.
        proc = subprocess.Popen(
            command,
            env=command_env(hz, max_steps),
            preexec_fn=pdeathsig_preexec(signal.SIGTERM),
        )
    except FileNotFoundError:
        sys.stderr.write(f"torchmem: command not found: {command[0]}\n")
        return 127
    except OSError as exc:
        sys.stderr.write(f"torchmem: cannot run {command[0]}: {exc}\n")
        return 126
    if not quiet:
        sys.stderr.write(
            f"torchmem: running {' '.join(command)}; every torch process in it is attachable "
            f"(torchmem attach {os.getpid()} follows them all)\n"
        )
    job.connect()
    follower.start()
    # A SIGTERM or SIGHUP for torchmem (a scheduler, a closed terminal) is the command's
    # too: passed on, then its end is waited for and summarised as any other.
    forwarded = {
        sig: signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
        for sig in (signal.SIGTERM, signal.SIGHUP)
    }
    try:
        while True:
            try:
                code = proc.wait()
                break
            except KeyboardInterrupt:  # the command got the same Ctrl+C: let it end
                proc.send_signal(signal.SIGINT)
    finally:
        for sig, handler in forwarded.items():
            signal.signal(sig, handler)
    job.detach()
    follower.join(5.0)
    job.close(grace_s=2.0)  # the last events of a rank that has just exited
    ranks = sorted(job.remotes, key=lambda r: (r.entry.rank or 0, r.pid))
    rows = [rank_row(r, session) for r in ranks]
    data = build_summary(
        "job",
        session,
        command=command,
        exit_code=code,
        duration_s=round(time.monotonic() - started, 3),
        ranks=rows,
        peak_reserved_bytes=session.peaks_of("reserved"),
        **job_outcome(rows),
    )
    if max_steps:
        data["max_steps"] = max_steps
    if not quiet or code != 0:
        peaks = ", ".join(f"{k} {format_bytes(v)}" for k, v in data["peak_bytes"].items())
        sys.stderr.write(
            f"torchmem: {' '.join(command[:3])}… exited with code {code} after "
            f"{data['duration_s']:.1f} s; {len(ranks)} process{'es' * (len(ranks) != 1)} "
            "with torch; peaks: "
            f"{peaks or 'none'}\n"
        )
    if summary_path and not write_summary(summary_path, data):
        return code or 1
    return code


def job_outcome(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What the ranks' rows say of the job: the steps every rank made (the fewest), the
    slowest rank's step time (it paces the others), and, when a rank failed, its status
    and message (the first failure by rank: an out-of-memory error in one rank ends the
    job as out of memory)."""
    if not rows:
        return {}
    times = [r["step_time_s"] for r in rows if r.get("step_time_s") is not None]
    out: dict[str, Any] = {
        "steps": min(r["steps"] for r in rows),
        "step_time_s": max(times) if len(times) == len(rows) else None,
    }
    failed = [r for r in rows if r.get("run_status") not in (None, "finished")]
    if failed:
        first = failed[0]
        who = f"rank {first['rank']}" if first.get("rank") is not None else f"pid {first['pid']}"
        out["status"] = first["run_status"]
        out["message"] = f"{who}: {first.get('message') or first['run_status']}"
    return out
