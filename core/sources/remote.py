"""A source for a process that runs elsewhere: its agent's events, into our Session.

:class:`RemoteSource` connects to one agent, shifts the agent's clock onto the Session's,
and submits every event it receives, so the views show an attached run exactly as they
show one of their own. Its commands (gc.collect, empty_cache, peaks, census, stop) are
requests to the agent; their results come back as ordinary events. A lost connection is
an event too: a log line and, for a run that had not ended, how it ended.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import replace
from typing import Any

import psutil

from torchmem.events import (
    EXIT_UNKNOWN,
    Alert,
    CapacityKnown,
    CensusTaken,
    CommandResult,
    LogRecord,
    Marker,
    MarkerKind,
    RunFinished,
    RunStarted,
    RunStatus,
    Sample,
    Stream,
)
from torchmem.series import said_by, scope_label, scoped
from torchmem.session import Session
from torchmem.sources.vanished import oom_killer_hint
from torchmem.timeseries import StepClock
from torchmem.transport.client import AgentClient, AttachError
from torchmem.transport.discovery import AgentEntry, boot_id
from torchmem.transport.protocol import ProtocolError
from torchmem.transport.wire import event_from_wire

#: The events that carry the process of a job they are of, as a field.
_SCOPED = (Sample, CapacityKnown, CensusTaken, Alert, CommandResult)


class RemoteSource:
    """Events of one agent, submitted to ``session``; in a job (``in_job``) its readings,
    censuses, alerts and command results carry its scope (``rank1``) as a field."""

    def __init__(
        self,
        session: Session,
        entry: AgentEntry,
        in_job: bool = False,
        report_end: bool = True,
        mode: str | None = None,
    ) -> None:
        self.session = session
        self.report_end = report_end
        #: How the agent's run is shown (``RunStarted.mode``): "isolated" for a child of
        #: the window; None keeps the agent's own.
        self.mode = mode
        self.entry = entry
        #: The process's scope in the Session (``rank1``); "" for a run's one process.
        self.scope = entry.scope if in_job else ""
        self.info: dict[str, Any] = {}
        self.offset = 0.0
        self.ended = threading.Event()
        self.end_reason = ""
        self.bad_frames = 0
        self._client = AgentClient(entry, self._on_events, self._on_closed)
        #: How the agent said its run ended (None until it did): the one record of it.
        self.finished: RunFinished | None = None
        #: This process's own step boundaries (a job's Session holds every rank's).
        self.steps = StepClock(capacity=1024)

    @property
    def run_finished_seen(self) -> bool:
        """True once the agent reported how its run ended."""
        return self.finished is not None

    @property
    def pid(self) -> int:
        """The attached process."""
        return self.entry.pid

    @property
    def label(self) -> str:
        """How the views name this process: its rank in a job, else its pid."""
        return scope_label(self.entry.scope)

    # -- life cycle -------------------------------------------------------------------------
    def connect(self) -> dict[str, Any]:
        """Connect, learn the agent's devices and clock, and subscribe to its events.

        The agent's clock is mapped onto the Session's at the handshake, so traces of
        several processes share one time axis; an empty Session takes the agent's clock
        as it is (times since the run started). Raises :class:`AttachError`.
        """
        welcome = self._client.connect()
        agent_now = welcome.get("now", 0.0)
        agent_now = float(agent_now) if isinstance(agent_now, (int, float)) else 0.0
        t0 = welcome.get("t0")
        same_clock = isinstance(t0, float) and welcome.get("boot_id") == boot_id() != ""
        if same_clock:  # one machine: both sessions count from CLOCK_MONOTONIC, exactly
            agent_now = time.monotonic() - t0
        if self.session.samples == 0 and self.session.run_started is None:
            self.session.align_clock(agent_now)
        self.offset = self.session.now() - agent_now
        self.info = self._client.request("info", timeout=10.0) or {}
        capacity = self._agent_capacity()
        if capacity:  # what the agent knew at the handshake; its later reports follow
            self.session.submit(CapacityKnown(self.session.now(), capacity, self.scope))
        self._client.request("subscribe", timeout=10.0)
        return welcome

    def close(self) -> None:
        """Disconnect (the agent and its process carry on)."""
        self._client.close()

    @property
    def connected(self) -> bool:
        """True while the connection is up."""
        return self._client.connected

    # -- what the window asks of a source ----------------------------------------------------
    @property
    def has_accelerator(self) -> bool:
        """True when the attached process uses an accelerator (enables empty_cache)."""
        return bool(self.info.get("has_accelerator"))

    def capacity(self) -> dict[str, int]:
        """Total memory per device of the attached process, as its agent reported it,
        under the Session's device names (``rank1/cuda:0`` in a job)."""
        return {scoped(self.scope, k): v for k, v in self._agent_capacity().items()}

    def _agent_capacity(self) -> dict[str, int]:
        caps = self.info.get("capacity") or {}
        return {k: v for k, v in caps.items() if isinstance(k, str) and isinstance(v, int)}

    def command(self, name: str) -> CommandResult:
        """Ask the agent to run a command and return what it did.

        The agent's result also arrives as an event (every viewer sees it), so it is not
        submitted here again; a failure to ask is, as a failed command result.
        """
        try:
            reply = self._client.request(name, timeout=60.0)
        except AttachError as exc:
            # In a job the result says its rank (CommandResult.said); alone, say the pid.
            message = str(exc) if self.scope else f"{self.label}: {exc}"
            result = CommandResult(self.session.now(), name, False, message, scope=self.scope)
            self.session.submit(result)
            return result
        reply = reply if isinstance(reply, dict) else {}
        return CommandResult(
            self.session.now(),
            name,
            reply.get("ok", True) is True,
            str(reply.get("message", "")),
            output=str(reply.get("output") or ""),
            scope=self.scope,
        )

    def request_stop(self) -> None:
        """Ask the attached script to stop at its next step."""
        self.command("stop")

    def mark(self, label: str) -> None:
        """Put a marker on the attached run's traces."""
        try:
            self._client.request("mark", {"label": label})
        except AttachError as exc:
            self.session.note(f"mark: {exc}")

    def set_rate(self, hz: float) -> None:
        """Change the agent's sampling rate."""
        with contextlib.suppress(AttachError):  # a lost connection is reported by _on_closed
            self._client.request("set_rate", {"hz": float(hz)}, timeout=2.0)

    def referrers(self, tensor: Any, scope: str = "") -> dict[str, Any]:
        """What keeps a tensor of the attached process alive (its referrer chain)."""
        return self._client.request(
            "referrers",
            {
                "device": tensor.device,
                "data_ptr": tensor.storage_key[1],
                "shape": list(tensor.shape),
                "stride": list(tensor.stride),
                "offset": tensor.storage_offset,
            },
            timeout=10.0,
        )

    def request(self, name: str, args: dict[str, Any] | None = None, timeout: float = 30.0) -> Any:
        """Any other request by name (history, snapshot, ping); raises AttachError."""
        return self._client.request(name, args, timeout)

    # -- from the reader thread ---------------------------------------------------------------
    def _on_events(self, events: list[dict[str, Any]], dropped: int) -> None:
        if dropped:
            self.session.note(
                f"{self.label}: {dropped} event batch(es) dropped (the viewer fell behind)"
            )
        for data in events:
            try:
                if isinstance(data, dict) and isinstance(data.get("t"), (int, float)):
                    data["t"] = data["t"] + self.offset
                event = event_from_wire(data)
            except ProtocolError:
                self.bad_frames += 1
                continue
            if isinstance(event, Marker) and event.kind is MarkerKind.STEP:
                self.steps.add(event.t, event.step)
            if isinstance(event, RunFinished):
                self.finished = event
                if self.scope:  # one rank ended, not the job: a line and a marker
                    text = f"{self.label}: {event.status.value}: {event.message}"
                    self.session.submit(LogRecord(event.t, Stream.TORCHMEM, text))
                    label = f"{self.label} {event.status.value}"
                    self.session.submit(Marker(event.t, MarkerKind.USER, label, 0))
                    continue
            if self.scope and isinstance(event, RunStarted) and self.session.run_started:
                text = f"{self.label}: running {event.script} {' '.join(event.argv)}".rstrip()
                self.session.submit(LogRecord(event.t, Stream.TORCHMEM, text))
                continue
            if self.mode is not None and isinstance(event, RunStarted):
                event = replace(event, mode=self.mode)
            if self.scope:
                event = self._renamed(event)
            elif isinstance(event, _SCOPED) and event.scope:
                event = replace(event, scope="")  # the viewer says whose readings they are
            self.session.submit(event)

    def _renamed(self, event: Any) -> Any:
        if isinstance(event, _SCOPED):  # the Session and the views say which process
            return replace(event, scope=self.scope)
        # "rank 1: detached ...": what each rank's agent says of itself would otherwise
        # read as the job's one process's.
        if isinstance(event, LogRecord) and event.stream is Stream.TORCHMEM:
            return replace(event, text=said_by(self.scope, event.text))
        return event

    def _on_closed(self, reason: str) -> None:
        self.end_reason = reason
        if reason == "closed":  # we closed it ourselves
            self.ended.set()
            return
        if not self.report_end:  # the owner of the process reports its end
            self.ended.set()
            return
        now = self.session.now()
        host = self.entry.host
        if host:  # another machine: its processes cannot be looked up from here
            gone = self.run_finished_seen
            reason = f"{reason} (the process on {host} ended, or the SSH connection dropped)"
        else:
            gone = _gone(self.entry.pid, wait_s=0.0 if self.run_finished_seen else 1.0)
        what = f"process {self.entry.pid} exited" if gone else reason
        if self.scope and gone and not self.run_finished_seen and not host:
            # One rank of a job killed from outside, most often by the OOM killer when
            # the machine's RAM ran out: say so, from that rank's last readings.
            what += " without a word (killed or crashed)" + oom_killer_hint(
                self.session, scope=self.scope
            )
        self.session.submit(LogRecord(now, Stream.TORCHMEM, f"{self.label}: detached: {what}"))
        if self.scope:
            self.session.submit(Marker(now, MarkerKind.USER, f"{self.label} ended", 0))
        elif not self.run_finished_seen:
            started = self.session.run_started
            duration = now - started.t if started is not None else 0.0
            if gone:
                status, message = (
                    RunStatus.KILLED,
                    (
                        f"process {self.entry.pid} ended while attached (killed or crashed; "
                        "exit status unknown)" + oom_killer_hint(self.session)
                    ),
                )
            else:
                status = RunStatus.FAILED
                message = f"lost the connection to process {self.entry.pid}: {reason}"
            self.session.submit(
                RunFinished(now, status, EXIT_UNKNOWN, message, duration_s=duration)
            )
        self.ended.set()


def _gone(pid: int, wait_s: float = 0.0) -> bool:
    """True when ``pid`` has exited (a zombie waiting for its parent has, too).

    A killed process closes its sockets before the kernel marks it exited, so the viewer
    can read the end of its connection first: ``wait_s`` gives it that long to go.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
