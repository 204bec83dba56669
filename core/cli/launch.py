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

from torchmem.cli.summary import build_summary, rank_row, write_summary
from torchmem.resources import path as resource_path
from torchmem.session import Session
from torchmem.sources.follow import follow
from torchmem.sources.processes import agents_for
from torchmem.sources.remote import RemoteSource
from torchmem.sources.totals import RankTotals
from torchmem.transport.client import AttachError
from torchmem.transport.discovery import runtime_dir
from torchmem.units import format_bytes


def hook_dir() -> Path:
    """The folder holding the startup hook (first on the command's PYTHONPATH)."""
    return resource_path("autoserve")


def command_env(hz: float) -> dict[str, str]:
    """The command's environment: the hook on PYTHONPATH, and where agents register."""
    env = dict(os.environ)
    env["TORCHMEM_AUTOSERVE"] = "1"
    env["TORCHMEM_HZ"] = f"{hz:g}"
    env["TORCHMEM_RUNTIME_DIR"] = str(runtime_dir())
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(hook_dir()), env.get("PYTHONPATH", "")) if p
    )
    return env


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
            if entry.pid in self.remotes:
                continue
            if entry.world_size and not self.totals.expected:
                self.totals.expected = {f"rank{r}" for r in range(entry.world_size)}
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
) -> int:
    """Run ``command`` with agents in its torch processes; return its exit code."""
    session = Session()
    follower = _RankFollower(session)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(command, env=command_env(hz))
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
    while True:
        try:
            code = proc.wait()
            break
        except KeyboardInterrupt:  # the command got the same Ctrl+C: let it end
            proc.send_signal(signal.SIGINT)
    follower.stop()
    ranks = sorted(follower.remotes.values(), key=lambda r: (r.entry.rank or 0, r.pid))
    data = build_summary(
        "job",
        session,
        command=command,
        exit_code=code,
        duration_s=round(time.monotonic() - started, 3),
        ranks=[rank_row(r) for r in ranks],
    )
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
