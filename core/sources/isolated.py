"""Isolated runs: the script in a child ``torchmem run --attachable``, attached at once.

Scripts that install signal handlers, spawn DataLoader workers with 'spawn', or need
allocator settings before torch starts are better off in a process of their own, and a
crash there (a segfault in an extension, the OOM killer) must never take the window with
it. :class:`IsolatedSource` offers the same ``run_script`` / ``request_stop`` /
``command`` as the in-process source, so the window drives both alike.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torchmem.events import CommandResult, LogRecord, RunFinished, RunStarted, RunStatus, Stream
from torchmem.probe.allocator import ALLOCATOR_ENV
from torchmem.probe.parent_watch import PARENT_ENV
from torchmem.probe.pipe_lines import PipeLines
from torchmem.probe.runner import ScriptError, validate_script
from torchmem.session import Session
from torchmem.sources.base import Script
from torchmem.sources.children import describe_exit, end_tree
from torchmem.sources.follow import follow
from torchmem.sources.remote import RemoteSource
from torchmem.sources.vanished import oom_killer_hint
from torchmem.transport.client import AttachError
from torchmem.transport.discovery import find_agent

#: How long the child may take to import torch and start its agent.
AGENT_TIMEOUT_S = 60.0
#: How long the end of a run waits for the child's pipes to be read to their end (a
#: worker the script left running can hold them open).
OUTPUT_DRAIN_S = 1.0


class IsolatedSource:
    """Runs scripts in a child process and shows them through its agent."""

    def __init__(self, session: Session, hz: float = 10.0) -> None:
        self.session = session
        self.hz = hz
        self.remote: RemoteSource | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._stop_requested_at: float | None = None
        self.steps_seen = 0
        self._env: dict[str, str] = {}  # the current run's own variables (allocator settings)

    # -- what the window asks of a source ----------------------------------------------------
    @property
    def running(self) -> bool:
        """True while the child process lives."""
        return self.process is not None and self.process.poll() is None

    @property
    def has_accelerator(self) -> bool:
        """True when the child uses an accelerator."""
        return self.remote is not None and self.remote.has_accelerator

    def command(self, name: str) -> list[CommandResult]:
        """gc.collect, empty_cache, reset peaks or a census, in the child."""
        remote = self.remote
        if remote is None or not remote.connected:
            result = CommandResult(self.session.now(), name, False, "no isolated run is attached")
            self.session.submit(result)
            return [result]
        return [remote.command(name)]

    def request_stop(self, grace_s: float = 2.0) -> None:
        """Stop the child's script at its next step; the child forces it after ``grace_s``
        and is terminated if it still runs well after that."""
        self._stop_requested_at = time.monotonic() + 2 * grace_s + 3.0
        if self.remote is not None and self.remote.connected:
            self.remote.command("stop")
        elif self.process is not None:
            with contextlib.suppress(OSError):
                self.process.send_signal(signal.SIGINT)

    def set_rate(self, hz: float) -> None:
        """The child's sampling rate (also for the next runs)."""
        self.hz = hz
        if self.remote is not None:
            self.remote.set_rate(hz)

    def referrers(self, tensor: Any, scope: str = "") -> dict[str, Any]:
        """What keeps a tensor of the child alive."""
        if self.remote is None:
            raise AttachError("no isolated run is attached")
        return self.remote.referrers(tensor)

    def close(self) -> None:
        """Stop a child still running (terminate, then kill) and disconnect."""
        if self.process is not None:
            end_tree(self.process)
        if self.remote is not None:
            self.remote.close()

    # -- a run -------------------------------------------------------------------------------
    def run_script(self, script: Script) -> RunFinished:
        """Run ``script`` in a child and follow it to its end; never raises for the script.

        The child's output always comes back as log records (its agent forwards them).
        """
        s = self.session
        args, cwd = script.args, script.cwd
        started = time.monotonic()
        self._stop_requested_at = None
        try:
            path = validate_script(script.path)
        except ScriptError as exc:
            return self._finish(RunFinished(s.now(), RunStatus.FAILED, 2, str(exc)))
        command = [
            sys.executable, "-m", "torchmem", "run", "--attachable", "--quiet", "--no-echo",
            "--wait-attach", f"{AGENT_TIMEOUT_S:g}", "--hz", f"{self.hz:g}", str(path), *args,
        ]  # fmt: skip
        return self._run_child(command, path, args, cwd, started, dict(script.env))

    def _run_child(
        self,
        command: list[str],
        path: Path,
        args: Sequence[str],
        cwd: str | None,
        started: float,
        env: dict[str, str] | None = None,
    ) -> RunFinished:
        s = self.session
        try:
            self.process = subprocess.Popen(
                command,
                cwd=cwd,
                # The child ends with this process, even if it is killed (see parent_watch).
                # Unbuffered: a worker's line arrives as it is printed, not at its exit.
                env={
                    **os.environ,
                    **(env or {}),
                    PARENT_ENV: str(os.getpid()),
                    "PYTHONUNBUFFERED": "1",
                },
                stdin=subprocess.DEVNULL,
                # The agent forwards what the script prints. These pipes carry the rest:
                # spawned processes (mp.spawn's ranks: the DDP tutorial prints from there)
                # and C libraries (gloo, NCCL, faulthandler's crash report). The child
                # echoes nothing of its own here (--no-echo): each line comes once.
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # Ctrl+C in the window's terminal is not the child's
            )
        except OSError as exc:
            return self._finish(
                RunFinished(s.now(), RunStatus.FAILED, 2, f"cannot start the child: {exc}")
            )
        assert self.process.stdout is not None and self.process.stderr is not None
        output = PipeLines(self.process.stdout, self._logger(Stream.STDOUT), "torchmem-child-out")
        errors = PipeLines(self.process.stderr, self._logger(Stream.STDERR), "torchmem-child-err")
        s.note(
            f"isolated run: process {self.process.pid}"
            + "".join(f", {k}={v}" for k, v in (env or {}).items())
        )
        self._env = env or {}
        try:
            self._attach(path, args)
            self._wait_for_exit()
        finally:
            if self.remote is not None:
                self.remote.close()
        code = self.process.returncode if self.process.returncode is not None else -1
        for reader in (output, errors):  # the last lines land before the run's end
            reader.join(OUTPUT_DRAIN_S)
        stderr_tail = errors.tail()
        if s.run_finished is not None and self.remote is not None and self.remote.run_finished_seen:
            result = s.run_finished
        else:
            status, message = describe_exit(
                code,
                stop_requested=self._stop_requested_at is not None,
                stderr_tail=stderr_tail,
                killed_hint=oom_killer_hint(s) if code == -signal.SIGKILL else "",
            )
            result = RunFinished(
                s.now(), status, code, message, stderr_tail, time.monotonic() - started
            )
        return self._finish(result)

    def _logger(self, stream: Stream) -> Callable[[str], None]:
        """Submits text read from the child's ``stream`` as the run's log."""
        session = self.session
        return lambda text: session.submit(LogRecord(session.now(), stream, text))

    def _attach(self, path: Path, args: Sequence[str]) -> None:
        """Wait for the child's agent and attach; a child that dies first is reported."""
        proc = self.process
        assert proc is not None
        deadline = time.monotonic() + AGENT_TIMEOUT_S

        def look() -> bool:  # True: keep waiting for the agent
            if proc.poll() is not None:
                return False
            entry = find_agent(proc.pid)
            if entry is not None:
                self.remote = RemoteSource(self.session, entry, report_end=False, mode="isolated")
                try:
                    self.remote.connect()
                except AttachError as exc:
                    self.session.note(str(exc))
                return False
            if time.monotonic() > deadline:
                self.session.note(
                    f"the child never started its agent within {AGENT_TIMEOUT_S:g} s; stopping it"
                )
                proc.terminate()
                return False
            if self._stop_requested_at is not None:
                proc.send_signal(signal.SIGINT)
                return False
            return True

        follow(look, threading.Event())
        if self.remote is None and proc.poll() is not None:
            # It died before its agent was up (an import error, a bad interpreter).
            allocator = {k: v for k, v in self._env.items() if k in ALLOCATOR_ENV}
            self.session.submit(
                RunStarted(self.session.now(), str(path), tuple(args), "isolated", allocator)
            )

    def _wait_for_exit(self) -> None:
        proc = self.process
        assert proc is not None

        def look() -> bool:  # True: the child still runs
            if proc.poll() is not None:
                return False
            if self._stop_requested_at is not None and time.monotonic() > self._stop_requested_at:
                end_tree(proc)  # it ignored the stop
            return True

        follow(look, threading.Event())
        if self.remote is not None:
            self.remote.ended.wait(2.0)  # the last events, sent as the child exits

    def _finish(self, result: RunFinished) -> RunFinished:
        s = self.session
        if s.run_finished is not result:
            s.submit(result)
        self.steps_seen = s.steps.steps
        return result
