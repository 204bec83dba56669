"""Series keys and what they mean: ``[scope/]device/metric``, their labels and tooltips.

Every reading is keyed ``"<device>/<metric>"`` (``cuda:0/allocated``, ``cpu/rss``); a
process of a job adds its scope in front (``rank1/cpu/rss``, ``total/cpu/rss``). Sources
and analyses take keys apart only through these helpers; views ask the Session what a
series is (:class:`SeriesName`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Metric:
    """What a metric name means, for labels and tooltips."""

    label: str
    tooltip: str
    #: Read less often than the sampler ticks: drawn as held steps with a dot per reading,
    #: never as ramps that invent values between readings.
    sparse: bool = False


METRICS: dict[str, Metric] = {
    "allocated": Metric(
        "allocated",
        "Bytes held by live tensors, as PyTorch's caching allocator counts them "
        "(memory_allocated). Rounded up to the allocator's block sizes.",
    ),
    "reserved": Metric(
        "reserved",
        "Bytes the caching allocator holds from the device: allocated plus its cache "
        "(memory_reserved). empty_cache() returns the unused part to the device.",
    ),
    "peak_allocated": Metric(
        "peak allocated",
        "Highest 'allocated' since the process started or since the last peak reset "
        "(max_memory_allocated).",
    ),
    "nvml_used": Metric(
        "NVML process",
        "GPU memory the driver charges to this process (what nvidia-smi shows). It includes "
        "the CUDA context, the allocator's cache and NCCL buffers, so it exceeds 'reserved'.",
    ),
    "rss": Metric(
        "process RSS",
        "Resident set size of the process: its pages in RAM, shared libraries included "
        "(CPU tensors live here; there is no PyTorch counter of CPU tensor bytes).",
    ),
    "rss_peak": Metric(
        "process peak RSS (kernel)",
        "The kernel's high-water mark of the process's RSS (VmHWM): the highest it has "
        "been since the process started (or, for a run in the window, since the run "
        "started), bursts between two samples included. Where it is above every sample, "
        "the RSS row's Peak shows it.",
    ),
    "uss": Metric(
        "process USS",
        "Unique set size: RAM that would be freed if the process exited (no shared pages). "
        "Read at most every 2 s because it is costly (a dot per reading), together with "
        "the RSS of the same moment, which it never exceeds.",
        sparse=True,
    ),
    "children": Metric(
        "child processes",
        "What the process's children (DataLoader workers, mp.spawn ranks, whatever else it "
        "started; not torchmem's own helpers) add to the machine: the sum of their USS, the "
        "pages each holds alone. A "
        "forked worker shares its parent's pages, which the parent's RSS already counts (its "
        "own RSS would count them again); it grows as workers touch, and so copy, those "
        "pages: a Python list in a Dataset does that. Read with USS, at most every 2 s.",
        sparse=True,
    ),
    "heap_free": Metric(
        "C heap free",
        "Bytes the C library's malloc holds free in this process's heap (glibc mallinfo2): "
        "freed memory kept for reuse, which RSS still counts. It grows as the heap "
        "fragments; the leak detector reads process RSS less this, so that the creep is "
        "not taken for a leak. Only where torchmem runs inside the process, on glibc.",
    ),
    "alloc_retries": Metric(
        "allocation retries",
        "How often cudaMalloc failed and the allocator flushed its cache to retry "
        "(num_alloc_retries): a near-OOM slowdown. A count, not bytes.",
        sparse=True,
    ),
    "pinned": Metric(
        "pinned host memory",
        "Page-locked host memory held by CUDA's pinned allocator, its cache included "
        "(DataLoader pin_memory, non_blocking copies): part of the RSS that the OS can "
        "never swap. From torch.cuda.host_memory_stats, once a second.",
        sparse=True,
    ),
    "pinned_active": Metric(
        "pinned host memory in use",
        "Pinned host blocks handed out and not yet reusable (active_bytes).",
        sparse=True,
    ),
    "inactive_split": Metric(
        "inactive split blocks",
        "Bytes in cached blocks the allocator split and cannot hand out whole "
        "(inactive_split_bytes): fragmentation. When it is large next to 'reserved', "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb) helps.",
        sparse=True,
    ),
    "ooms": Metric(
        "out-of-memory errors",
        "Out-of-memory errors the allocator raised so far (num_ooms), caught or not. "
        "A count, not bytes.",
        sparse=True,
    ),
    "available": Metric(
        "system available",
        "RAM the operating system can still give to processes without swapping.",
    ),
}


#: The metric of the kernel's high-water mark of the RSS: an RSS series' peak where higher.
KERNEL_PEAK = "rss_peak"

#: Metrics that are not byte counts (not drawn on the memory axes).
COUNT_METRICS = frozenset({"alloc_retries", "ooms"})


def split_key(key: str) -> tuple[str, str]:
    """``("cuda:0", "allocated")`` for ``cuda:0/allocated`` (a scope stays with the device:
    ``("rank1/cuda:0", "allocated")``)."""
    device, _, metric = key.rpartition("/")
    return device, metric


def split_scope(key: str) -> tuple[str, str]:
    """``("rank1", "cuda:0/allocated")`` for a series of one process of a job (``rank1``,
    ``pid4242``) or of the job's total (``total``); ``("", key)`` for a single process."""
    head, sep, rest = key.partition("/")
    if sep and "/" in rest:
        return head, rest
    return "", key


def split_device(name: str) -> tuple[str, str]:
    """``("rank1", "cuda:0")`` for a device of one process of a job (``rank1/cuda:0``, as
    censuses and peaks name them); ``("", "cuda:0")`` for a single process's."""
    scope, _, device = name.rpartition("/")
    return scope, device


def scoped(scope: str, name: str) -> str:
    """``name`` (a series key, a device) of the process or sum ``scope``: ``rank1/cpu``;
    ``name`` itself for a single process (``""``). The inverse of :func:`split_scope`."""
    return f"{scope}/{name}" if scope else name


#: The scope of a job's sums over all its processes.
TOTAL_SCOPE = "total"


def rank_scope(rank: int) -> str:
    """The scope of rank ``rank`` of a job (``rank1``): unique across the job's nodes."""
    return f"rank{rank}"


def process_scope(pid: int, host: str = "") -> str:
    """The scope of a process that has no rank (``pid4242``, ``pid4242@node1``)."""
    return f"pid{pid}@{host}" if host else f"pid{pid}"


def node_scope(host: str) -> str:
    """The scope of one machine's sums in a multi-node job (``@node1``)."""
    return f"@{host}"


def is_rank_scope(scope: str) -> bool:
    """True for the scope of one rank of a job (``rank1``)."""
    return scope.startswith("rank") and scope[4:].isdigit()


def is_node_scope(scope: str) -> bool:
    """True for the sums of one machine of a job (``@node1``)."""
    return scope.startswith("@")


def scope_index(scope: str) -> int:
    """The number in a process's scope (the rank, or the pid): what picks its colour."""
    digits = "".join(c for c in scope.partition("@")[0] if c.isdigit())
    return int(digits) if digits else 0


def is_sum_scope(scope: str) -> bool:
    """True for the scopes torchmem adds up, which no process has: the job's ``total`` and
    a machine's (``@node1``)."""
    return scope == TOTAL_SCOPE or is_node_scope(scope)


def scope_order(scope: str) -> tuple[bool, bool, list[Any]]:
    """Sort key of a scope: processes (rank 2 before rank 10), then machines, the job's
    total last."""
    parts = [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", scope)]
    return scope == TOTAL_SCOPE, is_node_scope(scope), parts


def device_order(name: str) -> tuple[tuple[bool, bool, list[Any]], bool, str]:
    """Sort key of a name within a scope: a census's device (``rank2/cpu``) or a summary's
    peak (``rank2/cpu_rss``, ``total/cuda:0``). Its scope's place first (:func:`scope_order`:
    rank 2 before rank 10, the job's total last), then the CPU, then by name."""
    return ProcessDevice(*split_device(name)).order()


def scope_label(scope: str) -> str:
    """``rank 1``, ``pid 4242``, ``total`` (of every rank), ``node node1`` (the total of a
    machine) for a series scope."""
    if scope == TOTAL_SCOPE:
        return "total"
    if is_node_scope(scope):  # the total of one machine of a multi-node job
        return f"node {scope[1:]}"
    for prefix in ("rank", "pid"):
        if scope.startswith(prefix) and scope[len(prefix) :].isdigit():
            return f"{prefix} {scope[len(prefix) :]}"
    return scope


def said_by(scope: str, text: str) -> str:
    """``text`` as the process ``scope`` of a job says it (``rank 1: Census: …``); ``text``
    itself for a run's one process (``""``)."""
    return f"{scope_label(scope)}: {text}" if scope else text


def process_device_label(scope: str, device: str) -> str:
    """``rank 2 · cpu`` for ``device`` of the process ``scope`` of a job (a census's
    :attr:`~torchmem.events.CensusTaken.scope` and one of its devices); ``device`` for a
    single process (``""``)."""
    return f"{scope_label(scope)} · {device}" if scope else device


class ProcessDevice(NamedTuple):
    """A device of one process of a job (``("rank2", "cpu")``), or of a run's one process
    (``("", "cuda:0")``): how the Session's census history names the devices it has seen."""

    scope: str
    device: str

    @property
    def label(self) -> str:
        """``rank 2 · cpu``; ``cuda:0`` for a run's one process."""
        return process_device_label(self.scope, self.device)

    def order(self) -> tuple[tuple[bool, bool, list[Any]], bool, str]:
        """Sort key: rank 2 before rank 10, then within a process the CPU first."""
        return scope_order(self.scope), self.device != "cpu", self.device


def series_label(key: str) -> str:
    """A readable label for a series key, e.g. ``cuda:0 allocated``, ``rank 1 process RSS``."""
    scope, key = split_scope(key)
    device, metric = split_key(key)
    info = METRICS.get(metric)
    label = info.label if info else metric
    if device not in ("cpu", "system"):
        label = f"{device} {label}"
    return f"{scope_label(scope)} {label}" if scope else label


@dataclass(frozen=True)
class SeriesName:
    """What one series is: the process of a job it is of (``scope``: ``rank1``,
    ``pid4242@node1``, a sum's ``total`` or ``@node1``; empty for a run's one process),
    its device and its metric. The Session names each series it keeps with one
    (:meth:`~torchmem.session.Session.name`); views read these fields, never the key."""

    scope: str
    device: str
    metric: str

    @classmethod
    @functools.lru_cache(maxsize=4096)  # views ask for every series at every redraw
    def of(cls, key: str) -> SeriesName:
        """The name of series ``key`` (``rank1/cuda:0/allocated``)."""
        scope, rest = split_scope(key)
        return cls(scope, *split_key(rest))

    @property
    def key(self) -> str:
        """The Session's key of the series: ``rank1/cpu/rss``."""
        return scoped(self.scope, f"{self.device}/{self.metric}")

    @property
    def label(self) -> str:
        """``rank 1 process RSS``, ``cuda:0 allocated``: :func:`series_label`."""
        return series_label(self.key)

    @property
    def sparse(self) -> bool:
        """Read less often than the sampler ticks (:attr:`Metric.sparse`)."""
        return self.metric in METRICS and METRICS[self.metric].sparse

    @property
    def is_count(self) -> bool:
        """A count (allocation retries, OOMs), not bytes."""
        return self.metric in COUNT_METRICS

    @property
    def host(self) -> bool:
        """A series of the machine's memory (``cpu``, ``system``), not an accelerator's."""
        return self.device in ("cpu", "system")

    @property
    def is_total(self) -> bool:
        """The job's sum over every process."""
        return self.scope == TOTAL_SCOPE

    @property
    def is_node(self) -> bool:
        """One machine's sum in a multi-node job."""
        return is_node_scope(self.scope)

    @property
    def is_rank(self) -> bool:
        """One rank of a job (not a process without a rank, not a sum)."""
        return is_rank_scope(self.scope)

    @property
    def index(self) -> int:
        """The number in the process's scope (its rank, or its pid): what picks its
        colour."""
        return scope_index(self.scope)

    def shown_in(self, scope: str | None) -> bool:
        """True when the view state's ``scope`` (one process or sum; None: every one)
        shows this series."""
        return scope is None or self.scope == scope
