"""Finding processes to attach to, watching them from outside, and headless attach.

A process with an agent (``torchmem.serve()``, ``torchmem run --attachable``, a rank of
``torchmem run -- torchrun ...``) is attached through its agent and shows everything a
run in the window shows. Any other Python process of the user that has torch loaded can
still be watched from outside: psutil's RSS and, with an NVIDIA driver, the GPU memory
the driver charges to it (CUDA context and allocator cache included).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from .backends import process_backends
from .client import AttachError
from .discovery import AgentEntry, list_agents
from .events import LogRecord, RunFinished, RunStarted, RunStatus, Stream
from .remote import RemoteSource
from .sampler import Sampler
from .session import Session
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
        caps: dict[str, int] = {}
        for backend in self.backends:
            try:
                caps.update(backend.capacity())
            except Exception:
                continue
        return caps

    def start(self) -> None:
        """Start sampling; the Session hears that a watch started."""
        s = self.session
        s.submit(RunStarted(s.now(), " ".join(self.cmdline[:1]), tuple(self.cmdline[1:]), "watch"))
        s.submit(
            LogRecord(
                s.now(),
                Stream.TORCHMEM,
                f"watching process {self.pid} from outside: RSS"
                + (
                    " and GPU memory as the driver reports it (CUDA context and caches included)"
                    if len(self.backends) > 1
                    else ""
                )
                + ". Inject the agent for steps, tensors and alerts.",
            )
        )
        self.sampler.start()

    def check(self) -> bool:
        """True while the process lives; reports its end once."""
        if self.ended:
            return False
        if self.process.is_running() and self.process.status() != psutil.STATUS_ZOMBIE:
            return True
        self.ended = True
        self.sampler.stop()
        s = self.session
        s.submit(RunFinished(s.now(), RunStatus.FINISHED, 0, f"process {self.pid} exited"))
        return False

    def close(self) -> None:
        """Stop sampling."""
        self.sampler.stop()


def attach_headless(
    pid: int,
    duration: float | None = None,
    summary_path: str | None = None,
    hz: float = 10.0,
    quiet: bool = False,
) -> int:
    """``torchmem attach``: collect for ``duration`` seconds (or until the process ends)
    and optionally write ``{"pid", "injected", "samples", "peak_bytes", "ranks"}``."""
    session = Session()
    entries = agents_for(pid)
    remotes: list[RemoteSource] = []
    watch: ProcessWatchSource | None = None
    if entries:
        multi = len(entries) > 1
        for entry in entries:
            prefix = f"rank{entry.rank}/" if multi and entry.rank is not None else ""
            if multi and not prefix:
                prefix = f"pid{entry.pid}/"
            remote = RemoteSource(session, entry, prefix)
            try:
                remote.connect()
            except AttachError as exc:
                sys.stderr.write(f"torchmem: {exc}\n")
                continue
            remotes.append(remote)
        if not remotes:
            return 1
    else:
        try:
            watch = ProcessWatchSource(session, pid, hz)
        except AttachError as exc:
            sys.stderr.write(f"torchmem: {exc}\n")
            return 1
        watch.start()
    if not quiet:
        what = (
            ", ".join(r.label for r in remotes) if remotes else "from outside (no agent: RSS, GPU)"
        )
        sys.stderr.write(
            f"torchmem: attached to {pid} ({what})"
            + (f" for {duration:g} s" if duration else " until it ends (Ctrl+C to detach)")
            + "\n"
        )
    deadline = time.monotonic() + duration if duration else None
    try:
        while deadline is None or time.monotonic() < deadline:
            if remotes and all(r.ended.is_set() for r in remotes):
                break
            if watch is not None and not watch.check():
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        pass
    finally:
        for remote in remotes:
            remote.close()
        if watch is not None:
            watch.close()
    data = {
        "pid": pid,
        "injected": False,
        "attached": "agent" if remotes else "process",
        "samples": session.samples,
        "peak_bytes": {k: int(v) for k, v in session.peak_bytes().items()},
        "ranks": [
            {
                "pid": r.pid,
                "rank": r.entry.rank,
                "world_size": r.entry.world_size,
                "ended": r.end_reason not in ("", "closed"),
            }
            for r in remotes
        ],
        "steps": session.steps.steps,
        "alerts": [a.to_json() for a in session.alert_list()],
    }
    if not quiet:
        peaks = ", ".join(f"{k} {format_bytes(v)}" for k, v in data["peak_bytes"].items())
        sys.stderr.write(
            f"torchmem: detached after {data['samples']} samples; peaks: {peaks or 'none'}\n"
        )
    if summary_path:
        out = Path(summary_path)
        try:
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text(json.dumps(data, indent=2) + "\n")
            os.replace(tmp, out)
        except OSError as exc:
            sys.stderr.write(f"torchmem: cannot write the summary to {summary_path}: {exc}\n")
            return 1
    return 0
