"""What every source offers its front ends: one typed interface, whatever it watches.

A source feeds a Session with events and takes requests back. The window and the command
line hold a :class:`Source` and never ask which kind it is: this process
(:class:`~torchmem.sources.inprocess.InProcessSource`), a child
(:class:`~torchmem.sources.isolated.IsolatedSource`) or processes attached through their
agents or watched from outside (:class:`~torchmem.sources.attached.AttachedRun`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from torchmem.events import CommandResult, RunFinished
from torchmem.session import Session


@dataclass(frozen=True)
class Script:
    """A script to run, as the user asked: ``python PATH ARGS`` in ``cwd``.

    ``capture_output`` tees its stdout and stderr into the Session as log records (the
    window, an agent); without it they only reach the terminal (a plain ``torchmem run``).
    """

    path: str | os.PathLike[str]
    args: tuple[str, ...] = ()
    cwd: str | None = None
    capture_output: bool = True
    #: Variables set for this run only (allocator settings): honoured by a child process;
    #: a run in this process cannot change an allocator that may already be running.
    env: tuple[tuple[str, str], ...] = ()
    #: Captured output is also written to the terminal (the streams it replaced). An
    #: isolated child turns it off: its window reads the child's terminal for what the
    #: capture cannot see (worker processes, C libraries), and would get the rest twice.
    echo: bool = True
    #: End the run cleanly (finished, exit code 0) once it has made this many steps
    #: (``--max-steps``, a tuning trial); None: never.
    max_steps: int | None = None


@runtime_checkable
class Source(Protocol):
    """A feed of one Session's events, and the requests it accepts."""

    session: Session

    @property
    def running(self) -> bool:
        """True while what it watches runs."""
        ...

    @property
    def has_accelerator(self) -> bool:
        """True when the watched process uses an accelerator (enables empty_cache)."""
        ...

    def command(self, name: str) -> list[CommandResult]:
        """Run a command of :data:`~torchmem.probe.commands.COMMANDS` in every watched
        process; one result each (also submitted to the Session as events)."""
        ...

    def request_stop(self) -> None:
        """Ask the script to stop at its next step (forced later where torchmem owns it)."""
        ...

    def set_rate(self, hz: float) -> None:
        """Sample this many times a second."""
        ...

    def referrers(self, tensor: Any, scope: str = "") -> dict[str, Any]:
        """What keeps a tensor of the latest census alive: ``{"chain": [...], ...}``;
        ``scope`` is the process of a job whose census holds it (``CensusTaken.scope``)."""
        ...

    def close(self) -> None:
        """Stop sampling and disconnect; what it watches carries on unless it owns it."""
        ...


@runtime_checkable
class ScriptSource(Source, Protocol):
    """A source that runs scripts itself (in this process, or in a child)."""

    def run_script(self, script: Script) -> RunFinished:
        """Run ``script`` to its end, sampling meanwhile; never raises for the script."""
        ...
