"""Where agents announce themselves: one private entry per agent in a per-user directory.

The directory is the user's runtime directory (``$XDG_RUNTIME_DIR/torchmem`` through
platformdirs, or ``$TORCHMEM_RUNTIME_DIR``), mode 0700 and owned by the user; torchmem
refuses a directory that another user owns or that others can enter, since its entries
hold the tokens that let a viewer in. Each agent writes ``agent-<pid>.json`` (mode 0600)
next to its socket ``agent-<pid>.sock``. An entry whose process is gone (or whose pid
was reused by another process) is stale: listing ignores it and removes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import warnings
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import psutil

from torchmem.series import process_scope, rank_scope

ENTRY_PREFIX = "agent-"


class DiscoveryError(Exception):
    """The runtime directory is missing, unsafe or unusable; the message says why."""


@dataclass
class AgentEntry:
    """What an agent publishes about itself (everything but the token is shown to users)."""

    pid: int
    create_time: float
    argv: list[str]
    cwd: str
    python: str
    torch: str
    torchmem: str
    protocol: int
    address: str  # a socket path, or "tcp:HOST:PORT"
    token: str
    hz: float
    rank: int | None = None
    local_rank: int | None = None
    world_size: int | None = None
    started: float = 0.0
    label: str = ""
    #: The kernel's start time of the process in clock ticks since boot (Linux): what
    #: tells a reused pid apart, where a wall-clock ``create_time`` moves with clock steps.
    start_ticks: int | None = None
    #: The SSH host the agent was reached through (set by the viewer; "" for this machine).
    host: str = ""

    def public(self) -> dict[str, Any]:
        """The entry without its token (for `torchmem ps --json` and the GUI)."""
        data = asdict(self)
        data.pop("token")
        return data

    @property
    def scope(self) -> str:
        """How the series of this process are prefixed in a job: ``rank1``, ``pid4242``,
        or ``pid4242@node1`` on another machine (pids repeat across machines)."""
        if self.rank is not None:
            return rank_scope(self.rank)  # a job's ranks are unique across its nodes
        return process_scope(self.pid, host_name(self.host) if self.host else "")

    @classmethod
    def from_json(cls, data: Any) -> AgentEntry:
        """An entry as read from its file. Fields this version does not know (an agent of
        another torchmem version) are ignored; a missing one raises TypeError."""
        if not isinstance(data, dict):
            raise TypeError("an agent entry is a JSON object")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def host_name(target: str) -> str:
    """An SSH target without its user: ``node1`` for ``user@node1``."""
    return target.rpartition("@")[2]


def boot_id() -> str:
    """This boot's id (Linux), so that a viewer knows it shares our monotonic clock."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def runtime_dir(create: bool = True) -> Path:
    """The per-user directory of agent entries, created 0700 and checked to be private."""
    override = os.environ.get("TORCHMEM_RUNTIME_DIR")
    if override:
        path = Path(override)
    else:
        import platformdirs

        with warnings.catch_warnings():  # "XDG_RUNTIME_DIR is not set": the fallback is fine
            warnings.simplefilter("ignore")
            base = platformdirs.user_runtime_dir("torchmem", appauthor=False)
        path = Path(base)
        if not _usable_parent(path.parent):
            path = Path(tempfile.gettempdir()) / f"torchmem-{os.getuid()}"
    if create:
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise DiscoveryError(f"cannot create the runtime directory {path}: {exc}") from exc
    if path.exists():
        check_private_dir(path)
    return path


def _usable_parent(parent: Path) -> bool:
    try:
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return False
    return os.access(parent, os.W_OK | os.X_OK)


def check_private_dir(path: Path) -> None:
    """Raise :class:`DiscoveryError` unless ``path`` is a directory only its owner (us) can use."""
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise DiscoveryError(f"{path} is not a directory (a link or a file is in its place)")
    if st.st_uid != os.getuid():
        raise DiscoveryError(
            f"{path} belongs to another user (uid {st.st_uid}); set TORCHMEM_RUNTIME_DIR "
            "to a private directory of yours"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        try:
            os.chmod(path, 0o700)
        except OSError as exc:
            raise DiscoveryError(
                f"{path} is open to other users (mode {stat.S_IMODE(st.st_mode):o}) and "
                f"cannot be made private: {exc}"
            ) from exc


def write_entry(entry: AgentEntry, directory: Path) -> Path:
    """Publish ``entry`` atomically as a 0600 file; returns its path."""
    path = directory / f"{ENTRY_PREFIX}{entry.pid}.json"
    tmp = directory / f".{ENTRY_PREFIX}{entry.pid}.{os.urandom(4).hex()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(entry), f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


def remove_entry(pid: int, directory: Path) -> None:
    """Remove an agent's entry and socket (missing files are fine)."""
    for name in (f"{ENTRY_PREFIX}{pid}.json", f"{ENTRY_PREFIX}{pid}.sock"):
        with contextlib.suppress(OSError):
            (directory / name).unlink()


def process_start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (Linux; None elsewhere)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # after the command name, field 3 on
    try:
        return int(fields[19])  # field 22: starttime
    except (IndexError, ValueError):
        return None


def proven_dead(entry: AgentEntry) -> bool:
    """True only when the entry's process is gone: no such pid, a zombie, or a pid reused
    by a process started at another time. A process that cannot be read, or a clock step
    since the entry was written, is not proof: deleting a live agent's socket once made
    it unreachable for good (the fuzz test's FileNotFoundError)."""
    try:
        proc = psutil.Process(entry.pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return True
    except psutil.NoSuchProcess:
        return True
    except (psutil.Error, OSError):
        return False
    if entry.start_ticks is not None:
        ticks = process_start_ticks(entry.pid)
        if ticks is not None:
            return ticks != entry.start_ticks
    try:
        return abs(proc.create_time() - entry.create_time) >= 1.0
    except (psutil.Error, OSError):
        return False


def read_entry(path: Path) -> AgentEntry | None:
    """The entry in ``path``, or None when it is unreadable, malformed or not private."""
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            return None
        data = json.loads(path.read_text())
        return AgentEntry.from_json(data)
    except (OSError, ValueError, TypeError):
        return None


def list_agents(directory: Path | None = None, clean: bool = True) -> list[AgentEntry]:
    """Live agents of this user, oldest first; stale entries are removed when ``clean``."""
    try:
        directory = directory or runtime_dir(create=False)
    except DiscoveryError:
        return []
    if not directory.is_dir():
        return []
    entries = []
    for path in sorted(directory.glob(f"{ENTRY_PREFIX}*.json")):
        entry = read_entry(path)
        if entry is None:
            continue
        if proven_dead(entry):
            if clean:
                remove_entry(entry.pid, directory)
            continue
        entries.append(entry)
    return sorted(entries, key=lambda e: (e.started, e.pid))


def find_agent(pid: int, directory: Path | None = None) -> AgentEntry | None:
    """The live agent of process ``pid``, if it has one."""
    return next((e for e in list_agents(directory) if e.pid == pid), None)
