"""An isolated run's child ends with the window that started it, whatever killed it.

The window starts ``torchmem run --attachable`` as a child and names itself in
:data:`PARENT_ENV`. A window closed with Ctrl+Q terminates its child; one killed by
``kill -9`` (or crashed) cannot, and the child would train on with nobody watching and
its output going nowhere. Two guards, because each alone has a gap:

- Linux's ``PR_SET_PDEATHSIG`` has the kernel send SIGTERM the moment the parent dies;
- a watchdog thread polls ``os.getppid()`` (reparenting to init or a subreaper) on every
  POSIX system, stops the script cooperatively, and exits if it will not stop.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
from collections.abc import Callable

from torchmem.probe.runner import echo

#: Set by the window for its isolated child: the pid whose death ends the child.
PARENT_ENV = "TORCHMEM_PARENT_PID"
_PR_SET_PDEATHSIG = 1


_PRCTL: Callable[..., int] | None = None


def _prctl() -> Callable[..., int] | None:
    """libc's prctl (Linux), loaded once: a forked child must not search for libraries."""
    global _PRCTL
    if _PRCTL is None and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _PRCTL = libc.prctl
    return _PRCTL


def set_pdeathsig(sig: int) -> bool:
    """Ask Linux to send ``sig`` to this process when its parent dies; False elsewhere."""
    prctl = _prctl()
    return prctl is not None and prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0


def pdeathsig_preexec(sig: int) -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes a child program get ``sig`` when the thread that
    started it dies (Linux; None elsewhere). Only a prctl call runs in the forked child:
    libc is loaded here, before the fork."""
    prctl = _prctl()
    if prctl is None:
        return None

    def in_child() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)

    return in_child


class ParentWatch:
    """Ends this process when ``parent_pid`` is gone: ``on_gone`` first, then ``_exit``.

    ``on_gone`` runs in the watchdog thread and should ask the script to stop; if the
    process still lives ``grace_s`` later, it exits with ``exit_code``.
    """

    def __init__(
        self,
        parent_pid: int,
        on_gone: Callable[[], None],
        grace_s: float = 10.0,
        exit_code: int = 130,
        poll_s: float = 0.5,
    ) -> None:
        self.parent_pid = parent_pid
        self.on_gone = on_gone
        self.grace_s = grace_s
        self.exit_code = exit_code
        self.poll_s = poll_s
        self._stop = threading.Event()
        self.kernel_guard = set_pdeathsig(signal.SIGTERM)
        self._thread = threading.Thread(target=self._run, name="torchmem-parent-watch", daemon=True)

    @classmethod
    def from_environment(cls, on_gone: Callable[[], None], **kwargs: float) -> ParentWatch | None:
        """A started watch on the pid in :data:`PARENT_ENV` (removed from the environment,
        so that the script's own children do not inherit it), or None when unset."""
        value = os.environ.pop(PARENT_ENV, "")
        if not value.isdigit():
            return None
        watch = cls(int(value), on_gone, **kwargs)
        watch.start()
        return watch

    @property
    def parent_alive(self) -> bool:
        """True while this process is still the child of ``parent_pid``."""
        return os.getppid() == self.parent_pid

    def start(self) -> None:
        """Start watching (the parent may already be gone: then it acts at once)."""
        self._thread.start()

    def close(self) -> None:
        """Stop watching (the run ended by itself)."""
        self._stop.set()

    def _run(self) -> None:
        while self.parent_alive:
            if self._stop.wait(self.poll_s):
                return
        # Through echo: stderr may be a pipe to the window that just died, and a raw
        # write there raised BrokenPipeError, which ended this thread before it could stop
        # the script (once in five kills of the window).
        echo(
            sys.stderr,
            f"torchmem: the window that started this run (pid {self.parent_pid}) is gone; "
            "stopping the script\n",
        )
        with contextlib.suppress(Exception):
            self.on_gone()
        if not self._stop.wait(self.grace_s):
            echo(sys.stderr, "torchmem: the script did not stop; exiting\n")
            os._exit(self.exit_code)
