"""The event types every source emits and the Session consumes.

Sources (the in-process runner, the sampler, agents in other processes) speak only these
types; the Session never cares where an event came from. Each is a small frozen
dataclass, so that it crosses threads as it is and a socket as plain data (transport.wire).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from torchmem.series import said_by, scoped, split_scope


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of every memory counter, ``t`` seconds after the session started.

    ``values`` maps a series key ``"<device>/<metric>"`` (``cuda:0/allocated``,
    ``cpu/rss``, ``system/available``) to bytes. ``step`` is set when the reading was
    taken at the boundary of that step (the same point of every iteration, which is
    where leak detection measures), ``None`` for the sampler's periodic readings.
    """

    t: float
    values: dict[str, float]
    step: int | None = None
    #: The process of a job the readings are of (``rank1``, ``pid4242@node1``), set by
    #: the source that follows it; empty for a run's one process. Its series are the
    #: Session's ``rank1/cpu/rss`` (:meth:`series`): no source renames a reading.
    scope: str = ""

    def series(self) -> dict[str, float]:
        """The readings under the Session's series keys: ``rank1/cpu/rss`` for a process
        of a job, the keys themselves for a run's one process."""
        if not self.scope:
            return self.values
        return {scoped(self.scope, key): value for key, value in self.values.items()}

    @classmethod
    def of_series(cls, t: float, series: dict[str, float], step: int | None = None) -> Sample:
        """The sample :meth:`series` gave ``series`` from (a recording keeps series keys):
        its process's readings under its scope field, where they all share one."""
        scopes = {split_scope(key)[0] for key in series}
        if len(scopes) != 1 or "" in scopes:
            return cls(t, series, step)
        scope = scopes.pop()
        return cls(t, {split_scope(key)[1]: v for key, v in series.items()}, step, scope)


class MarkerKind(str, Enum):
    """What a marker on the traces stands for."""

    STEP = "step"
    EPOCH = "epoch"
    USER = "user"

    @classmethod
    def of_label(cls, label: str) -> MarkerKind:
        """The kind of a user's mark: ``epoch …`` draws an epoch line, anything else a
        user marker (the one rule for ``torchmem.mark`` and an agent's ``mark`` request)."""
        return cls.EPOCH if label.lower().startswith("epoch") else cls.USER


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
    #: Allocator settings the run was started with (``PYTORCH_CUDA_ALLOC_CONF``, ...), where
    #: torchmem set them for it; runs compared side by side show them.
    allocator: dict[str, str] = field(default_factory=dict)


class RunStatus(str, Enum):
    """How a run ended."""

    FINISHED = "finished"
    FAILED = "failed"
    STOPPED = "stopped"
    OOM = "out of memory"
    #: Ended from outside while attached (kill -9, a crash, the OOM killer): nobody saw
    #: its exit status, so ``exit_code`` is :data:`EXIT_UNKNOWN`.
    KILLED = "killed or crashed"
    #: A process watched from outside (no agent) exited: only its parent can read how,
    #: so ``exit_code`` is :data:`EXIT_UNKNOWN`; never reported as finished.
    ENDED = "ended"


#: ``RunFinished.exit_code`` of a run whose exit status nobody saw (``KILLED``, ``ENDED``).
EXIT_UNKNOWN = -1


@dataclass(frozen=True, slots=True)
class RunFinished:
    """A script ended: its exit code, how, and (when it raised) the traceback."""

    t: float
    status: RunStatus
    exit_code: int
    message: str
    traceback: str = ""
    duration_s: float = 0.0

    def headline(self, steps: int) -> str:
        """``Failed (exit code 1) after 12.3 s, 400 steps``: how it ended, in one line."""
        from torchmem.units import format_duration

        code = (
            "exit status unknown"
            if self.exit_code == EXIT_UNKNOWN
            else f"exit code {self.exit_code}"
        )
        return (
            f"{self.status.value.capitalize()} ({code}) after "
            f"{format_duration(self.duration_s)}, {steps:,} steps"
        )


@dataclass(frozen=True, slots=True)
class CommandResult:
    """What a user action (gc.collect, empty_cache, reset peaks, ...) changed.

    ``output`` is the file the action wrote, if any (a memory snapshot), as a path on the
    machine of the process that ran it.
    """

    t: float
    command: str
    ok: bool
    message: str
    changes: dict[str, float] = field(default_factory=dict)
    output: str = ""
    #: The process of a job that ran it (see :attr:`Sample.scope`); ``message`` and
    #: ``changes`` are that process's own.
    scope: str = ""

    @property
    def said(self) -> str:
        """The message, with the process of a job that it is about: ``rank 1: Census:
        …``; each rank of a job says its own result."""
        return said_by(self.scope, self.message)


@dataclass(frozen=True, slots=True)
class CensusTaken:
    """A census of live tensors (a :class:`~torchmem.tensors.model.Census`), and when.

    ``trigger`` says why it was taken: ``"user"`` (Refresh), ``"step"`` (automatic, at a
    step boundary), ``"leak"`` (a growth under suspicion: the culprits' evidence) or
    ``"oom"`` (in the frames of an out-of-memory error).
    """

    t: float
    step: int
    census: Any
    trigger: str = "user"
    #: The process of a job it was taken in (see :attr:`Sample.scope`); its devices keep
    #: their own names (``cpu``, ``cuda:0``). Empty for a run's one process.
    scope: str = ""


class _Word(str, Enum):
    """An enum whose members read as their value in text (``f"{kind}"`` is ``leak``)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class AlertKind(_Word):
    """What an alert is about."""

    LEAK = "leak"  # a series grows step after step
    EPOCH_GROWTH = "epoch_growth"  # each epoch ends higher than the one before
    CACHE_GROWTH = "cache_growth"  # the allocator's cache grows while allocations do not
    CAPACITY = "capacity"  # a device is nearly full
    ALLOC_RETRIES = "alloc_retries"  # the allocator had to free its cache and retry
    WORKER_GROWTH = "worker_growth"  # child processes (DataLoader workers) hold ever more


class Severity(_Word):
    """How urgent an alert is."""

    WARNING = "warning"
    CRITICAL = "critical"


class AlertState(_Word):
    """Whether an alert still holds."""

    ACTIVE = "active"
    RESOLVED = "resolved"


@dataclass(frozen=True, slots=True)
class Alert:
    """A memory problem: raised once per ``key``, then updated in place, then resolved.

    ``culprits`` are plain dicts (name pattern, dtype, shape, grad_fn, count and bytes per
    step, holder), so the alert can be written to JSON as it is.
    """

    t: float
    key: str
    kind: AlertKind
    severity: Severity
    state: AlertState
    series: str
    first_step: int
    step: int
    message: str
    suggestion: str
    per_step: float = 0.0
    per_minute: float = 0.0
    culprits: tuple[dict[str, Any], ...] = ()
    raised_step: int = 0
    #: The process of a job that raised it (see :attr:`Sample.scope`); ``key``,
    #: ``series`` and ``message`` are that process's own, as its detector wrote them.
    scope: str = ""

    @property
    def is_new(self) -> bool:
        """True for the event that raised the alert (not an update, not its resolution)."""
        return self.state is AlertState.ACTIVE and self.step == self.raised_step

    @property
    def session_key(self) -> str:
        """What tells the alert from every other of the Session (the rows of the Alerts
        list, muting): ``leak:cpu/rss``, ``rank1/leak:cpu/rss`` for a process of a job.
        Files written before the field held this in ``key``: they read the same."""
        return scoped(self.scope, self.key)

    @property
    def said(self) -> str:
        """The message, with the process of a job that it is about: ``rank 1: process
        RSS grew…``."""
        return said_by(self.scope, self.message)

    @property
    def headline(self) -> str:
        """``⚠ epoch growth: cpu/rss at the start of each epoch rose…``."""
        return f"⚠ {self.kind.replace('_', ' ')}: {self.said}"

    def to_json(self) -> dict[str, Any]:
        """The alert as written in a run summary."""
        return {
            "kind": self.kind,
            "severity": self.severity,
            "state": self.state,
            "series": scoped(self.scope, self.series),
            "first_step": self.first_step,
            "raised_at_step": self.raised_step,
            "last_step": self.step,
            "message": self.said,
            "suggestion": self.suggestion,
            "bytes_per_step": round(self.per_step),
            "bytes_per_minute": round(self.per_minute),
            "culprits": list(self.culprits),
        }


@dataclass(frozen=True, slots=True)
class CapacityKnown:
    """The total memory of devices, in bytes (``{"cpu": ..., "cuda:0": ...}``), as a source
    learns them: at a run's start, and when the run first uses an accelerator. The
    Session keeps their union; views, the leak detector, summaries and recordings read
    it there (one copy, recorded and replayed with the run)."""

    t: float
    capacity: dict[str, int]
    #: The process of a job whose devices these are (see :attr:`Sample.scope`).
    scope: str = ""

    def devices(self) -> dict[str, int]:
        """The capacities under the Session's device names (``rank1/cuda:0``)."""
        return {scoped(self.scope, device): n for device, n in self.capacity.items()}


@dataclass(frozen=True, slots=True)
class JobMembers:
    """The processes of a job whose readings add up to its totals, as an attached source
    knows them: from ``t`` on, the Session sums each series over ``expected`` (once every
    one of them has reported; over whichever have, while ``expected`` is empty), and per
    machine where ``nodes`` maps a process's scope to its machine's (``rank3`` ->
    ``@node1``). ``ended`` are processes whose last reading no longer holds memory.
    Submitted again, whole, when the membership changes; recorded and replayed with the
    run, so that a reopened job has the totals it had live."""

    t: float
    expected: tuple[str, ...] = ()
    nodes: dict[str, str] = field(default_factory=dict)
    ended: tuple[str, ...] = ()


Event = (
    Sample
    | Marker
    | LogRecord
    | RunStarted
    | RunFinished
    | CommandResult
    | CensusTaken
    | Alert
    | CapacityKnown
    | JobMembers
)
