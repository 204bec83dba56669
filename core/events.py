"""The event types every source emits and the Session consumes.

Sources (the in-process runner, the sampler, later agents in other processes) speak only
these types; the Session never cares where an event came from. Each is a small frozen
dataclass so that it can cross threads (and later a socket) as plain data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of every memory counter, ``t`` seconds after the session started.

    ``values`` maps a series key ``"<device>/<metric>"`` (``cuda:0/allocated``,
    ``cpu/rss``, ``system/available``) to bytes.
    """

    t: float
    values: dict[str, float]


class MarkerKind(str, Enum):
    """What a marker on the traces stands for."""

    STEP = "step"
    EPOCH = "epoch"
    USER = "user"


@dataclass(frozen=True, slots=True)
class Marker:
    """A point in time worth a line on the traces: a step boundary or a user mark."""

    t: float
    kind: MarkerKind
    label: str = ""
    step: int = 0


class Stream(str, Enum):
    """Where a log line came from."""

    STDOUT = "stdout"
    STDERR = "stderr"
    TORCHMEM = "torchmem"


@dataclass(frozen=True, slots=True)
class LogRecord:
    """Text the script printed, or a message of torchmem's own."""

    t: float
    stream: Stream
    text: str


@dataclass(frozen=True, slots=True)
class RunStarted:
    """A script started running."""

    t: float
    script: str
    argv: tuple[str, ...]
    mode: str = "thread"


class RunStatus(str, Enum):
    """How a run ended."""

    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"
    OOM = "out of memory"


@dataclass(frozen=True, slots=True)
class RunFinished:
    """A script ended: its exit code, how, and (when it raised) the traceback."""

    t: float
    status: RunStatus
    exit_code: int
    message: str
    traceback: str = ""
    duration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a user action (gc.collect, empty_cache, reset peaks) changed."""

    t: float
    command: str
    ok: bool
    message: str
    changes: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CensusTaken:
    """A census of live tensors (a :class:`~torchmem.tensor_census.Census`), and when.

    ``trigger`` says why it was taken: ``"user"`` (Refresh) or ``"step"`` (automatic, at a
    step boundary).
    """

    t: float
    step: int
    census: Any
    trigger: str = "user"


Event = Sample | Marker | LogRecord | RunStarted | RunFinished | CommandResult | CensusTaken
