"""The processes one can attach to: live agents, and the user's other torch processes.

``torchmem ps`` and the Attach dialog list them. A process with an agent shows everything
a run in the window shows; any other Python process of the user that has torch loaded can
still be watched from outside (see :mod:`torchmem.sources.watch`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from torchmem.probe import nvml
from torchmem.transport.discovery import AgentEntry, list_agents


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

    @classmethod
    def from_json(cls, row: dict[str, Any], host: str = "") -> ProcessInfo:
        """A row of another machine's ``torchmem ps --json``, for showing (its agent has
        no token: attaching reads that over SSH when it is time)."""
        agent = row.get("agent")
        entry = None
        if isinstance(agent, dict):
            try:
                entry = AgentEntry.from_json({**agent, "token": "", "host": host})
            except TypeError:
                entry = None
        return cls(
            pid=int(row["pid"]),
            cmdline=[str(a) for a in row.get("cmdline") or []],
            rss=int(row.get("rss_bytes") or 0),
            gpu_bytes=row.get("gpu_bytes"),
            agent=entry,
        )


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


def list_processes(include_plain: bool = True) -> list[ProcessInfo]:
    """Every live agent, and (``include_plain``) every other Python process of this user
    with torch loaded, oldest first."""
    agents = {e.pid: e for e in list_agents()}
    gpu = nvml.bytes_by_pid()
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
    """Agents of ``pid`` and of the ranks it started (``mp.spawn``), or, for a launcher
    without an agent of its own (torchrun), of all its descendants."""
    agents = list_agents()
    own = [e for e in agents if e.pid == pid]
    try:
        children = {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return own
    found = sorted((e for e in agents if e.pid in children), key=lambda e: (e.rank or 0, e.pid))
    if own:
        # A script that serves itself and starts its ranks (mp.spawn): the ranks come
        # with it. Its other children that serve (spawned DataLoader workers) do not.
        return own + [e for e in found if e.rank is not None]
    return found


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
