"""Finding processes to attach to, watching them from outside, and headless attach.

A process with an agent (``torchmem.serve()``, ``torchmem run --attachable``, a rank of
``torchmem run -- torchrun ...``) is attached through its agent and shows everything a
run in the window shows. Any other Python process of the user that has torch loaded can
still be watched from outside: psutil's RSS and, with an NVIDIA driver, the GPU memory
the driver charges to it (CUDA context and allocator cache included).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from .backends import backends_capacity, process_backends
from .client import AttachError
from .discovery import AgentEntry, list_agents
from .events import CommandResult, RunFinished, RunStarted, RunStatus
from .rank_totals import RankTotals
from .remote import RemoteSource
from .sampler import Sampler
from .session import Session
from .summary import build_summary, rank_row, write_summary
from .units import format_bytes


@dataclass
class ProcessInfo:
    """A row of ``torchmem ps``: a process, its memory, and its agent if it has one."""

    pid: int
    cmdline: list[str]
    rss: int
    gpu_bytes: int | None
    agent: AgentEntry | None = None
    children: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The row as ``torchmem ps --json`` writes it (never the agent's token)."""
        return {
            "pid": self.pid,
            "cmdline": self.cmdline,
            "rss_bytes": self.rss,
            "gpu_bytes": self.gpu_bytes,
            "attachable": self.agent is not None,
            "agent": self.agent.public() if self.agent else None,
        }


def _has_torch(proc: psutil.Process) -> bool:
    """True when the process has loaded libtorch (read from its memory map)."""
    maps = Path(f"/proc/{proc.pid}/maps")
    try:
        if maps.exists():
            with maps.open("rb") as f:
                return any(b"libtorch" in line for line in f)
        return any("libtorch" in m.path for m in proc.memory_maps(grouped=True))
    except (OSError, psutil.Error):
        return False


def _is_viewer(cmd: list[str]) -> bool:
    """True for a torchmem window or ``torchmem ps/attach`` (torch loaded, nothing to
    attach to): ``torchmem ...`` or ``python -m torchmem ...`` other than ``run``."""
    for i, arg in enumerate(cmd[:3]):
        module = arg == "torchmem" and cmd[i - 1 : i] == ["-m"]
        if module or (i < 2 and Path(arg).name == "torchmem"):  # the entry point's script
            rest = cmd[i + 1 :]
            return not rest or rest[0] != "run"
    return False


def _gpu_bytes_by_pid() -> dict[int, int]:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return {}
    used: dict[int, int] = {}
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if p.usedGpuMemory is not None:
                    used[p.pid] = used.get(p.pid, 0) + int(p.usedGpuMemory)
    except Exception:
        pass
    return used


def list_processes(include_plain: bool = True) -> list[ProcessInfo]:
    """Every live agent, and (``include_plain``) every other Python process of this user
    with torch loaded, oldest first."""
    agents = {e.pid: e for e in list_agents()}
    gpu = _gpu_bytes_by_pid()
    me = os.getpid()
    uid = os.getuid()
    rows: list[ProcessInfo] = []
    for proc in psutil.process_iter(["pid", "name", "cmdline", "uids", "memory_info"]):
        info = proc.info
        pid = info["pid"]
        if pid == me:
            continue
        agent = agents.get(pid)
        if agent is None:
            if not include_plain:
                continue
            uids = info.get("uids")
            if uids is None or uids.real != uid:
                continue
            name = (info.get("name") or "").lower()
            cmd = info.get("cmdline") or []
            if "python" not in name and not (cmd and "python" in Path(cmd[0]).name):
                continue
            if _is_viewer(cmd):
                continue
            if not _has_torch(proc):
                continue
        mem = info.get("memory_info")
        rows.append(
            ProcessInfo(
                pid,
                list(info.get("cmdline") or (agent.argv if agent else [])),
                int(mem.rss) if mem else 0,
                gpu.get(pid),
                agent,
            )
        )
    return rows


def agents_for(pid: int) -> list[AgentEntry]:
    """Agents of ``pid`` itself, or (for a launcher such as torchrun) of its descendants."""
    agents = list_agents()
    own = [e for e in agents if e.pid == pid]
    if own:
        return own
    try:
        children = {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return []
    return sorted((e for e in agents if e.pid in children), key=lambda e: (e.rank or 0, e.pid))


class ProcessWatchSource:
    """Watches a process without an agent from outside: RSS and NVML per-process memory."""

    def __init__(self, session: Session, pid: int, hz: float = 10.0) -> None:
        try:
            self.process = psutil.Process(pid)
            cmdline = self.process.cmdline()
        except psutil.NoSuchProcess:
            raise AttachError(f"no process with pid {pid}") from None
        except psutil.AccessDenied:
            raise AttachError(f"process {pid} belongs to another user") from None
        self.session = session
        self.pid = pid
        self.cmdline = cmdline
        self.backends = process_backends(pid)
        self.sampler = Sampler(self.backends, session.submit, hz, clock=session.now)
        self.has_accelerator = False
        self.ended = False

    def capacity(self) -> dict[str, int]:
        """Total memory per device, where known."""
        return backends_capacity(self.backends)

    def start(self) -> None:
        """Start sampling; the Session hears that a watch started."""
        s = self.session
        s.submit(RunStarted(s.now(), " ".join(self.cmdline[:1]), tuple(self.cmdline[1:]), "watch"))
        s.note(
            f"watching process {self.pid} from outside: RSS"
            + (
                " and GPU memory as the driver reports it (CUDA context and caches included)"
                if len(self.backends) > 1
                else ""
            )
            + ". Inject the agent for steps, tensors and alerts."
        )
        self.sampler.start()

    def check(self) -> bool:
        """True while the process lives; reports its end once."""
        if self.ended:
            return False
        try:
            if self.process.is_running() and self.process.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:  # it vanished between the two questions: it ended
            pass
        self.ended = True
        self.sampler.stop()
        s = self.session
        s.submit(RunFinished(s.now(), RunStatus.FINISHED, 0, f"process {self.pid} exited"))
        return False

    def close(self) -> None:
        """Stop sampling."""
        self.sampler.stop()


class AttachedRun:
    """Everything attached for one pid: its agent, the agents of its ranks, or a watch.

    The window and ``torchmem attach`` use it alike: :meth:`connect`, then
    :meth:`follow` until the processes end or :meth:`detach` is called. Commands go to
    every attached agent; their results come back as events of the Session.
    """

    def __init__(
        self,
        session: Session,
        pid: int,
        hz: float = 10.0,
        entries: list[AgentEntry] | None = None,
        inject: bool = False,
    ) -> None:
        self.session = session
        self.pid = pid
        self.inject = inject
        self.injected = False
        #: Given entries (an agent reached through a forwarded socket) skip discovery.
        self.entries = entries
        self.hz = hz
        self.remotes: list[RemoteSource] = []
        self.watch: ProcessWatchSource | None = None
        self.totals: RankTotals | None = None
        self._detach = threading.Event()

    def connect(self) -> None:
        """Attach to the agents of ``pid`` (or its ranks), else watch it from outside.

        Raises :class:`AttachError` when nothing can be attached, saying why.
        """
        entries = self.entries if self.entries is not None else agents_for(self.pid)
        if not entries and self.inject:
            from .inject import InjectError, inject_agent

            self.session.note(f"injecting the agent into {self.pid} (experimental)…")
            try:
                entries = [inject_agent(self.pid)]
            except InjectError as exc:
                raise AttachError(f"cannot inject the agent: {exc}") from None
            self.injected = True
        if not entries:
            self.watch = ProcessWatchSource(self.session, self.pid, self.hz)
            self.watch.start()
            return
        multi = len(entries) > 1
        errors = []
        if multi:  # before the first connection, so that no live sample is missed
            # Nothing counts until every rank is connected (replays arrive meanwhile).
            self.totals = RankTotals(self.session, {e.scope for e in entries}, math.inf)
        for entry in entries:
            prefix = f"{entry.scope}/" if multi else ""
            remote = RemoteSource(self.session, entry, prefix)
            try:
                remote.connect()
            except AttachError as exc:
                errors.append(str(exc))
                if self.totals is not None:
                    self.totals.forget(entry.scope)
                continue
            self.remotes.append(remote)
        if not self.remotes:
            if self.totals is not None:
                self.totals.close()
            raise AttachError("; ".join(errors))
        if self.totals is not None:  # the clock is the agents' now: replays come before it
            self.totals.since = self.session.now()
        for error in errors:  # some ranks attached, others not: say which
            self.session.note(error)

    @property
    def label(self) -> str:
        """What is attached, for titles and status lines."""
        if self.watch is not None:
            return f"pid {self.pid} (from outside)"
        if len(self.remotes) == 1:
            return f"pid {self.remotes[0].pid}"
        return f"pid {self.pid}: " + ", ".join(r.label for r in self.remotes)

    @property
    def ended(self) -> bool:
        """True once every attached process has ended (or the watch saw its exit)."""
        if self.watch is not None:
            return not self.watch.check()
        return all(r.ended.is_set() for r in self.remotes)

    def follow(self, duration: float | None = None, close: bool = True) -> None:
        """Block until the processes end, :meth:`detach` is called, or ``duration`` passes;
        then close the connections unless told not to."""
        deadline = time.monotonic() + duration if duration else None
        forgotten: set[str] = set()
        while not self._detach.is_set() and not self.ended:
            if deadline is not None and time.monotonic() >= deadline:
                break
            if self.totals is not None:
                for remote in self.remotes:
                    scope = remote.prefix.rstrip("/")
                    if remote.ended.is_set() and scope not in forgotten:
                        forgotten.add(scope)
                        self.totals.forget(scope)
            self._detach.wait(0.05)
        if close:
            self.close()

    def detach(self) -> None:
        """Stop following (from any thread); the processes carry on."""
        self._detach.set()

    def close(self) -> None:
        """Close every connection and the watch."""
        for remote in self.remotes:
            remote.close()
        if self.watch is not None:
            self.watch.close()
        if self.totals is not None:
            self.totals.close()

    # -- what the window asks of a source ----------------------------------------------------
    @property
    def has_agent(self) -> bool:
        """True when attached through agents (commands, censuses, stop are available)."""
        return bool(self.remotes)

    @property
    def has_accelerator(self) -> bool:
        """True when an attached process uses an accelerator."""
        return any(r.has_accelerator for r in self.remotes)

    def capacity(self) -> dict[str, int]:
        """Total memory per device of the attached processes."""
        caps: dict[str, int] = {}
        for remote in self.remotes:
            caps.update(remote.capacity())
        if self.watch is not None:
            caps.update(self.watch.capacity())
        return caps

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

    def request_stop(self, grace_s: float = 2.0) -> None:
        """Ask every attached script to stop at its next step."""
        self.command("stop")

    def set_rate(self, hz: float) -> None:
        """Change the sampling rate of every agent (or of the watch)."""
        for remote in self.remotes:
            remote.set_rate(hz)
        if self.watch is not None:
            self.watch.sampler.set_rate(hz)

    def referrers(self, tensor: Any) -> dict[str, Any]:
        """What keeps ``tensor`` (from a census of an attached process) alive."""
        for remote in self.remotes:  # a rank's tensors carry its prefix: "rank1/cpu"
            if len(self.remotes) == 1 or tensor.device.startswith(remote.prefix):
                return remote.referrers(tensor)
        raise AttachError(f"no attached process holds tensors on {tensor.device}")


def entry_from_file(path: str, address: str | None = None) -> AgentEntry:
    """An agent entry copied from another machine, reached at ``address`` (the local end
    of an SSH-forwarded socket). Raises AttachError with what is wrong."""
    try:
        data = json.loads(Path(path).read_text())
        entry = AgentEntry(**data)
    except OSError as exc:
        raise AttachError(f"cannot read the agent entry {path}: {exc.strerror}") from None
    except (ValueError, TypeError):
        raise AttachError(f"{path} is not a torchmem agent entry (agent-PID.json)") from None
    if address:
        entry.address = address
    return entry


def attach_headless(
    pid: int,
    duration: float | None = None,
    summary_path: str | None = None,
    hz: float = 10.0,
    quiet: bool = False,
    entries: list[AgentEntry] | None = None,
    inject: bool = False,
    snapshot: bool = False,
) -> int:
    """``torchmem attach``: collect for ``duration`` seconds (or until the process ends)
    and optionally write ``{"pid", "injected", "samples", "peak_bytes", "ranks"}``.

    With ``snapshot``, CUDA allocation history is recorded while attached and a
    memory_viz snapshot written by each process at the end (listed as ``"snapshots"``).
    """
    session = Session()
    run = AttachedRun(session, pid, hz, entries, inject)
    try:
        run.connect()
    except AttachError as exc:
        sys.stderr.write(f"torchmem: {exc}\n")
        return 1
    if snapshot and not run.remotes:
        run.close()
        sys.stderr.write(
            f"torchmem: --snapshot needs an agent in process {pid}: start it with "
            "torchmem.serve() or `torchmem run --attachable`, or add --inject\n"
        )
        return 1
    recording = False
    if snapshot:
        started = run.command("history_start")
        for result in started:
            if not result.ok:
                sys.stderr.write(f"torchmem: no snapshot: {result.message}\n")
        recording = any(result.ok for result in started)
    if not quiet:
        if not run.remotes:
            what = "from outside: no agent, so RSS and GPU memory only"
        elif len(run.remotes) == 1:
            argv = run.remotes[0].entry.argv
            what = ("injected agent: " if run.injected else "agent: ") + " ".join(argv)[:80]
        else:
            what = f"{len(run.remotes)} processes: " + ", ".join(r.label for r in run.remotes)
        sys.stderr.write(
            f"torchmem: attached to pid {pid} ({what})"
            + (f" for {duration:g} s" if duration else " until it ends (Ctrl+C to detach)")
            + "\n"
        )
    attached_at = time.monotonic()
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl+C detaches; the summary is still written
        run.follow(duration, close=False)
    snapshots = _save_snapshots(run) if recording else []
    run.close()
    data = build_summary(
        "attach",
        session,
        pid=pid,
        injected=run.injected,
        attached="agent" if run.remotes else "process",
        duration_s=round(time.monotonic() - attached_at, 3),
        ranks=[rank_row(r) for r in run.remotes],
    )
    if snapshot:
        data["snapshots"] = snapshots
    if not quiet:
        for path in snapshots:
            sys.stderr.write(f"torchmem: memory snapshot {path} (open it on memory_viz)\n")
        peaks = ", ".join(f"{k} {format_bytes(v)}" for k, v in data["peak_bytes"].items())
        sys.stderr.write(
            f"torchmem: detached after {data['samples']} samples; peaks: {peaks or 'none'}\n"
        )
    if summary_path and not write_summary(summary_path, data):
        return 1
    return 0


def _save_snapshots(run: AttachedRun) -> list[str]:
    """Ask each attached process still running for a snapshot, then stop its recording;
    the files written, as paths on that process's machine."""
    paths = []
    for result in run.command("snapshot"):
        if result.ok:
            paths.append(result.output)
        else:
            sys.stderr.write(f"torchmem: no snapshot: {result.message}\n")
    run.command("history_stop")
    return paths
