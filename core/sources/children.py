"""Child processes torchmem starts: how they are ended, and how they ended.

An isolated run, a tuning trial, a lab worker and a snapshot reader each run in a child
process (a crash or an OOM there must never take the window with it), and each used to
end its child and read its status in code of its own. Ending: the whole tree under the
child (torchrun starts each rank in a session of its own, which a signal to the group
misses), SIGTERM first where the child may clean up, SIGKILL after a grace. Reading: a
negative status is the signal that ended it (``subprocess``'s convention); 130 is how
a run ends when it is stopped (a shell's code for Ctrl+C); 0 is success; anything else
is a failure; each is said with the last line the process wrote to stderr.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess

import psutil

from torchmem.events import RunStatus
from torchmem.probe.runner import EXIT_STOPPED

#: How long a child is waited for after SIGKILL.
KILL_WAIT_S = 5.0


def signal_tree(pid: int, sig: int) -> None:
    """Send ``sig`` to ``pid``'s process group and to every process under it: torchrun
    starts each rank in a session of its own, which the group signal misses."""
    try:
        below = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        below = []
    with contextlib.suppress(OSError):
        os.killpg(pid, sig)
    for child in below:
        with contextlib.suppress(psutil.Error):
            child.send_signal(sig)


def end_tree(proc: subprocess.Popen, grace_s: float = 5.0) -> int | None:
    """End child ``proc`` and everything under it: SIGTERM, then SIGKILL after
    ``grace_s`` (at once for 0). Its exit status; None if even SIGKILL did not reap it."""
    if proc.poll() is not None:
        return proc.returncode
    if grace_s > 0:
        signal_tree(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            return proc.wait(grace_s)
    signal_tree(proc.pid, signal.SIGKILL)
    try:
        return proc.wait(KILL_WAIT_S)
    except subprocess.TimeoutExpired:
        return None


def signal_name(code: int) -> str:
    """``SIGKILL`` for the status ``-9`` of a child that a signal ended."""
    with contextlib.suppress(ValueError):
        return signal.Signals(-code).name
    return f"signal {-code}"


def describe_exit(
    code: int, *, stop_requested: bool = False, stderr_tail: str = "", killed_hint: str = ""
) -> tuple[RunStatus, str]:
    """The status and message of a process that exited with ``code``.

    ``stop_requested``: the user asked it to stop (a signal then ended a stop, not a
    failure). ``stderr_tail``: its last output, whose last line says why it failed.
    ``killed_hint``: what its last readings say of a SIGKILL (the OOM killer, see
    :func:`~torchmem.sources.vanished.oom_killer_hint`), said in place of the guess.
    """
    if code < 0:
        name = signal_name(code)
        if stop_requested:
            # Asked to stop, it reached no step and no Python code (a C call): ended by
            # the signal the Stop action sends after its grace.
            return (
                RunStatus.STOPPED,
                f"stopped by the user: ended by {name}, blocked where no step came",
            )
        why = ""
        if name == "SIGKILL":
            why = killed_hint or " (by hand, a scheduler, or the OOM killer)"
        return RunStatus.FAILED, f"the process was killed by {name}{why}"
    status = {0: RunStatus.FINISHED, EXIT_STOPPED: RunStatus.STOPPED}.get(code, RunStatus.FAILED)
    # torchmem's own account of the run (`torchmem run` ends with it) or the traceback's
    # last line.
    lines = stderr_tail.strip().splitlines()
    return status, lines[-1] if lines else f"the process exited with code {code}"
