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

import psutil

from torchmem.probe.parent_watch import pdeathsig_preexec
from torchmem.report.summary import build_summary, rank_row, write_summary
from torchmem.resources import path as resource_path
from torchmem.series import rank_scope
from torchmem.session import Session
from torchmem.sources.follow import follow
from torchmem.sources.processes import agents_for
from torchmem.sources.remote import RemoteSource
from torchmem.sources.totals import RankTotals
from torchmem.transport.client import AttachError
from torchmem.transport.discovery import AgentEntry, runtime_dir
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


#: How long an ``mp.spawn`` child may take to publish its rank before it is attached
#: without one (labelled by its pid). Nothing is lost meanwhile: a viewer that attaches
#: late gets the agent's last minutes of samples.
RANK_WAIT_S = 10.0


def rank_may_come(entry: AgentEntry, now: float | None = None) -> bool:
    """True for a process started by multiprocessing's spawn (``mp.spawn``'s ranks) that
    has not published a rank yet and is young enough to: it learns it only when it calls
    ``init_process_group`` (see ``Agent._learn_rank``). Spawn gives the child its parent's
    ``sys.argv``, so the command line the kernel holds is what tells."""
    if entry.rank is not None:
        return False
    if (time.time() if now is None else now) - entry.create_time >= RANK_WAIT_S:
        return False
    try:
        return "--multiprocessing-fork" in psutil.Process(entry.pid).cmdline()
    except psutil.Error:  # gone, or not ours to read: attach it as it is
        return False


class _RankFollower:
    """Attaches to each agent among this process's descendants as it appears."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.remotes: dict[int, RemoteSource] = {}
        self.totals = RankTotals(session)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="torchmem-ranks", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        follow(self._look, self._stop, period_s=0.25)

    def _look(self) -> bool:
        for entry in agents_for(os.getpid()):
            if entry.pid in self.remotes or rank_may_come(entry):
                continue
            if entry.world_size and not self.totals.expected:
                self.totals.expected = {rank_scope(r) for r in range(entry.world_size)}
            remote = RemoteSource(self.session, entry, f"{entry.scope}/", report_end=True)
            try:
                remote.connect()
            except AttachError:
                continue
            self.remotes[entry.pid] = remote
        return True  # until the command ends and stop() is called

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)
        for remote in list(self.remotes.values()):
            remote.ended.wait(2.0)  # the last events of a rank that just exited
            remote.close()
        self.totals.close()


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
    follower = _RankFollower(session)
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
    follower.stop()
    ranks = sorted(follower.remotes.values(), key=lambda r: (r.entry.rank or 0, r.pid))
    rows = [rank_row(r) for r in ranks]
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
            f"{data['duration_s']:.1f} s; {len(ranks)} process(es) with torch; peaks: "
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
