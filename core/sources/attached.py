"""Everything attached for one pid: its agent, the agents of its ranks, or a watch from outside.

One class for every way torchmem follows processes it did not start in-process: the window's
and ``torchmem attach``'s attach (the agents there now), and ``torchmem run -- COMMAND``
(the agents of the command's processes, attached as they appear).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from torchmem.events import CommandResult, JobMembers
from torchmem.series import node_scope, rank_scope, scope_label
from torchmem.session import Session
from torchmem.sources.follow import follow
from torchmem.sources.processes import agents_for, rank_may_come
from torchmem.sources.remote import RemoteSource
from torchmem.sources.watch import ProcessWatchSource
from torchmem.transport.client import AttachError
from torchmem.transport.discovery import AgentEntry, host_name
from torchmem.transport.ssh import SshHost, Tunnel, remote_entries


class AttachedRun:
    """Everything attached for one pid: its agent, the agents of its ranks, or a watch.

    The window and ``torchmem attach`` use it alike: :meth:`connect`, then
    :meth:`follow` until the processes end or :meth:`detach` is called. Commands go to
    every attached agent; their results come back as events of the Session.

    With ``hosts``, the agents run on other machines and are reached over SSH: those of
    ``pid`` on the one host, or (``pid`` None) every agent of every host, such as all the
    ranks of a multi-node job. A host that cannot be reached is reported and the others
    attached.

    With ``follow_new``, the agents among ``pid``'s descendants are attached as they
    appear, each under its scope from the first (``rank0/``, ``pid123/``), until
    :meth:`detach`: the processes of a command this process started, which come and go
    while it runs.
    """

    def __init__(
        self,
        session: Session,
        pid: int | None,
        hz: float = 10.0,
        entries: list[AgentEntry] | None = None,
        inject: bool = False,
        hosts: list[SshHost] | None = None,
        follow_new: bool = False,
    ) -> None:
        self.session = session
        self.follow_new = follow_new
        self.pid = pid
        self.hosts = list(hosts or [])
        self.tunnels: list[Tunnel] = []
        self.inject = inject
        self.injected = False
        #: Given entries (an agent reached through a forwarded socket) skip discovery.
        self.entries = entries
        self.hz = hz
        self.remotes: list[RemoteSource] = []
        self.watch: ProcessWatchSource | None = None
        #: The job's members as last submitted (None for a single process): the Session
        #: sums their readings into the job's totals.
        self.job: JobMembers | None = None
        self._detach = threading.Event()

    def connect(self) -> None:
        """Attach to the agents of ``pid`` (or its ranks), else watch it from outside.

        Raises :class:`AttachError` when nothing can be attached, saying why (never with
        ``follow_new``: the processes may not have started yet).
        """
        if self.follow_new:  # every process that comes counts, until the world size is known
            self._set_job(JobMembers(self.session.now()))
            self._attach_new()
            return
        if self.hosts:
            entries = self._forwarded()
        elif self.entries is not None:
            entries = self.entries
        elif self.pid is not None:
            entries = agents_for(self.pid)
        else:
            raise AttachError("nothing to attach to: give a pid or a host")
        if not entries and self.inject and self.pid is not None:
            from torchmem.transport.inject import InjectError, inject_agent

            self.session.note(f"injecting the agent into {self.pid} (experimental)…")
            try:
                entries = [inject_agent(self.pid)]
            except InjectError as exc:
                raise AttachError(f"cannot inject the agent: {exc}") from None
            self.injected = True
        if not entries and self.pid is not None:
            self.watch = ProcessWatchSource(self.session, self.pid, self.hz)
            self.watch.start()
            return
        multi = len(entries) > 1
        errors = []
        for entry in entries:
            remote = RemoteSource(self.session, entry, in_job=multi)
            try:
                remote.connect()
            except AttachError as exc:
                errors.append(str(exc))
                continue
            self.remotes.append(remote)
        if not self.remotes:
            self._close_tunnels()
            raise AttachError("; ".join(errors))
        if multi:  # every rank connected, its history replayed: the job's sums start now
            hosts = {e.host for e in entries}
            nodes = {e.scope: node_scope(host_name(e.host)) for e in entries}
            expected = tuple(r.entry.scope for r in self.remotes)
            self._set_job(JobMembers(self.session.now(), expected, nodes if len(hosts) > 1 else {}))
        for error in errors:  # some ranks attached, others not: say which
            self.session.note(error)

    def _attach_new(self) -> None:
        """Attach the agents of ``pid``'s descendants that appeared since the last look
        (one not ready to answer yet is tried again at the next)."""
        assert self.pid is not None and self.job is not None
        known = {r.pid for r in self.remotes}
        for entry in agents_for(self.pid):
            if entry.pid in known or rank_may_come(entry):
                continue
            if entry.world_size and not self.job.expected:
                ranks = tuple(rank_scope(r) for r in range(entry.world_size))
                self._set_job(replace(self.job, expected=ranks))
            remote = RemoteSource(self.session, entry, in_job=True)
            try:
                remote.connect()
            except AttachError:
                continue
            self.remotes.append(remote)

    def _forwarded(self) -> list[AgentEntry]:
        """The agents on the hosts, each reached through a local end of an SSH tunnel.

        Hosts are asked at once (a host that times out delays none of the others); the
        tunnels are started from this thread, which follows the run, since each ssh dies
        with the thread that started it.
        """
        pid = self.pid if len(self.hosts) == 1 else None
        with ThreadPoolExecutor(max_workers=min(16, len(self.hosts))) as pool:
            listed = list(pool.map(lambda h: _entries_or_error(h, pid), self.hosts))
        errors = [found for found in listed if isinstance(found, str)]
        started = []
        for host, found in zip(self.hosts, listed, strict=True):
            if isinstance(found, str):
                continue
            tunnel = Tunnel(host)
            try:
                tunnel.start(found)
            except AttachError as exc:
                errors.append(str(exc))
                continue
            started.append(tunnel)
        entries: list[AgentEntry] = []
        for tunnel in started:
            try:
                entries += tunnel.wait()
            except AttachError as exc:
                errors.append(str(exc))
                continue
            self.tunnels.append(tunnel)
        if not entries:
            raise AttachError("; ".join(errors))
        for error in errors:  # some hosts attached, others not: say which
            self.session.note(error)
        return sorted(entries, key=lambda e: (e.rank is None, e.rank or 0, e.host, e.pid))

    @property
    def label(self) -> str:
        """What is attached, for titles and status lines."""
        if self.watch is not None:
            return f"pid {self.pid} (from outside)"
        where = f" on {', '.join(h.name for h in self.hosts)}" if self.hosts else ""
        if len(self.remotes) == 1:
            return f"pid {self.remotes[0].pid}{where}"
        what = f"pid {self.pid}: " if self.pid is not None else ""
        return what + ", ".join(r.label for r in self.remotes) + where

    def lost_hosts(self) -> list[str]:
        """Hosts whose every process stopped reporting without saying it ended: the SSH
        connection (or the machine) dropped, as far as this viewer can tell."""
        lost = []
        for host in self.hosts:
            remotes = [r for r in self.remotes if r.entry.host == host.target]
            if remotes and all(
                r.ended.is_set() and not r.run_finished_seen and r.end_reason != "closed"
                for r in remotes
            ):
                lost.append(host.target)
        return lost

    def reporting(self) -> tuple[int, int]:
        """(hosts whose processes still report, hosts attached): "3 of 4 nodes"."""
        hosts = {r.entry.host for r in self.remotes}
        alive = {r.entry.host for r in self.remotes if not r.ended.is_set()}
        return len(alive), len(hosts)

    @property
    def ended(self) -> bool:
        """True once every attached process has ended (or the watch saw its exit)."""
        if self.watch is not None:
            return not self.watch.check()
        return all(r.ended.is_set() for r in self.remotes)

    def follow(self, duration: float | None = None, close: bool = True) -> None:
        """Block until the processes end, :meth:`detach` is called, or ``duration`` passes;
        then close the connections unless told not to. With ``follow_new`` only a detach
        or the deadline ends it (none of the processes may have started yet)."""

        def look() -> bool:
            if self.follow_new:
                self._attach_new()
            if self.job is not None:  # a rank that ended no longer counts in the total
                ended = [r.entry.scope for r in self.remotes if r.ended.is_set()]
                new = tuple(s for s in ended if s not in self.job.ended)
                if new:
                    self._set_job(replace(self.job, ended=self.job.ended + new))
            return self.follow_new or not self.ended

        # Looking for new processes reads the process table: four times a second is enough.
        period = 0.25 if self.follow_new else 0.05
        follow(look, self._detach, period_s=period, duration_s=duration)
        if close:
            self.close()

    def detach(self) -> None:
        """Stop following (from any thread); the processes carry on."""
        self._detach.set()

    def close(self, grace_s: float = 0.0) -> None:
        """Close every connection and the watch, after waiting up to ``grace_s`` for the
        last events of each process that is ending (a rank that has just exited)."""
        for remote in self.remotes:
            if grace_s:
                remote.ended.wait(grace_s)
            remote.close()
        if self.watch is not None:
            self.watch.close()
        self._close_tunnels()

    def _set_job(self, members: JobMembers) -> None:
        """Tell the Session (and so the recording) who the job's members are now."""
        self.job = members
        self.session.submit(members)

    def _close_tunnels(self) -> None:
        for tunnel in self.tunnels:
            tunnel.close()
        self.tunnels = []

    # -- what the window asks of a source ----------------------------------------------------
    @property
    def has_agent(self) -> bool:
        """True when attached through agents (commands, censuses, stop are available)."""
        return bool(self.remotes)

    @property
    def has_accelerator(self) -> bool:
        """True when an attached process uses an accelerator."""
        return any(r.has_accelerator for r in self.remotes)

    def command(self, name: str) -> list[CommandResult]:
        """Run a command in every attached process still running; the results also
        arrive as events."""
        if not self.remotes:
            result = CommandResult(
                self.session.now(),
                name,
                False,
                f"process {self.pid} has no agent: commands need torchmem.serve() in the "
                "script, or a launch through `torchmem run --attachable`",
            )
            self.session.submit(result)
            return [result]
        return [remote.command(name) for remote in self.remotes if not remote.ended.is_set()]

    def request_stop(self) -> None:
        """Ask every attached script to stop at its next step."""
        self.command("stop")

    @property
    def running(self) -> bool:
        """True while an attached process lives."""
        return not self.ended

    def set_rate(self, hz: float) -> None:
        """Change the sampling rate of every agent (or of the watch)."""
        for remote in self.remotes:
            remote.set_rate(hz)
        if self.watch is not None:
            self.watch.sampler.set_rate(hz)

    def referrers(self, tensor: Any, scope: str = "") -> dict[str, Any]:
        """What keeps ``tensor`` alive, asked of the process whose census (of ``scope``:
        ``rank1``) holds it."""
        for remote in self.remotes:
            if len(self.remotes) == 1 or remote.entry.scope == scope:
                return remote.referrers(tensor)
        raise AttachError(f"no attached process is {scope_label(scope) or 'the one asked'}")


def _entries_or_error(host: SshHost, pid: int | None) -> list[AgentEntry] | str:
    """The agents on ``host`` (of ``pid``, or all), or what went wrong, said for the user."""
    try:
        found = remote_entries(host, pid)
    except AttachError as exc:
        return str(exc)
    if not found:
        what = f"process {pid}" if pid is not None else "any process"
        return (
            f"{what} on {host.target} has no agent: start the run there with `torchmem run "
            "--attachable` (or torchmem.serve() in the script); over SSH torchmem attaches "
            "through agents only"
        )
    return found
