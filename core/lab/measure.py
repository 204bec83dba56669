"""Measure one operation at one size: new storage, peak extra memory, allocations, sharing,
time, and what autograd saves for backward.

Runs in the process that calls it (the lab's worker child, or the caller when asked).
Memory on the CPU has no allocator statistics, so it comes from PyTorch's profiler, which
records every allocation and free with its size; on an accelerator the allocator's own
peak counter gives the peak exactly. What autograd keeps comes from
``saved_tensors_hooks``: every tensor the graph packs, by storage.
"""

from __future__ import annotations

import contextlib
import io
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from torchmem.lab.ops import EXPRESSION_INPUTS, Operation, operation

#: Timed runs take at least this long in all (more repeats for fast operations).
MIN_TIMED_S = 0.05


@dataclass(frozen=True)
class Job:
    """One (operation, size) to measure."""

    op: str
    size: int
    dtype: str = "float32"
    device: str = "cpu"
    repeats: int = 5
    #: Inputs require grad: also measure what autograd saves for backward.
    grad: bool = False


@dataclass
class Row:
    """What the lab measured for one job (the JSON rows of ``torchmem lab --json``)."""

    op: str
    size: int
    dtype: str
    device: str
    code: str = ""
    #: Bytes of new storage the result owns (0 when it is an input's own storage).
    result_bytes: int | None = None
    #: The most memory the operation held at once beyond its inputs, result included.
    peak_extra_bytes: int | None = None
    #: Allocations the operation made (the allocate-in-a-loop pair differs here).
    allocations: int | None = None
    shares_input_storage: bool | None = None
    median_s: float | None = None
    #: Bandwidth (bytes/s) or FLOP/s, as ``rate_unit`` says.
    rate: float | None = None
    rate_unit: str = ""
    #: With grad: bytes autograd saves for backward beyond the inputs, and what.
    saved_bytes: int | None = None
    saved: list[str] = field(default_factory=list)
    why: str = ""
    #: Why the row was not measured (no accelerator); the row is not an error.
    skipped: str = ""
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        """As ``torchmem lab --json`` writes it."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Row:
        """The row a worker sent."""
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


def measure(job: Job) -> Row:
    """Measure ``job`` here; every failure is a row with its ``error`` (or ``skipped``)."""
    row = Row(job.op, job.size, job.dtype, job.device)
    try:
        import torch

        op = operation(job.op)
        row.code, row.why = op.code, op.why
        dtype = getattr(torch, job.dtype, None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"not a torch dtype: {job.dtype!r} (e.g. float32, bfloat16)")
        device = torch.device(job.device)
        missing = _missing_device(torch, device)
        if missing:
            row.error = missing
            return row
        if op.accelerator and device.type == "cpu":
            row.skipped = "needs an accelerator: a host-to-device copy has nothing to copy to"
            return row
        if job.grad and op.in_place:
            row.skipped = "autograd refuses an in-place operation on a leaf that requires grad"
            return row
        _measure(op, job, dtype, device, row)
    except Exception as exc:  # the user's expression, a dtype the op lacks, a shape error
        row.error = f"{type(exc).__name__}: {exc}".strip()
    return row


def _missing_device(torch: Any, device: Any) -> str:
    """Why ``device`` cannot be used here, for a user ("" when it can): torch's own words
    for a CPU build asked for CUDA were "AssertionError: Torch not compiled with CUDA
    enabled"."""
    from torchmem.probe.devices import device_problem

    return device_problem(str(device))


def _inputs(op: Operation, job: Job, dtype: Any, device: Any) -> dict[str, Any]:
    import torch

    torch.manual_seed(0)
    n = job.size
    grad = job.grad and dtype.is_floating_point

    def make(where: Any) -> Any:
        if dtype.is_floating_point or dtype.is_complex:
            t = torch.randn(n, n, dtype=dtype, device=where)
        else:
            t = torch.randint(0, 100, (n, n), dtype=dtype, device=where)
        return t.requires_grad_(grad)

    x = {name: make(device) for name in op.inputs}
    for name in op.host_inputs:
        host = make("cpu")
        x[name] = host.pin_memory() if op.pinned else host
    return x


def _sync(device: Any) -> None:
    import torch

    if device.type != "cpu":
        getattr(torch, device.type).synchronize(device)


def _tensors(value: Any) -> list[Any]:
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _storage(t: Any) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


def _measure(op: Operation, job: Job, dtype: Any, device: Any, row: Row) -> None:
    import torch

    x = _inputs(op, job, dtype, device)
    inputs = {_storage(t)[0] for t in x.values()}
    # Memory: one run under the profiler (every allocation and free, with its size).
    accel = getattr(torch, device.type) if device.type != "cpu" else None
    if accel is not None:
        # One run first: a library's one-time set-up is not the operation's cost (the
        # first matmul of a process allocates cuBLAS's 32 MiB workspace, which made a
        # 4 MiB product read "peak +36 MiB" on an H200, and only in the first row).
        op.run(x)  # its result is dropped at once
        _sync(device)
        before = accel.memory_allocated(device)
        accel.reset_peak_memory_stats(device)
    result, events = _profiled(op, x, device)
    if accel is not None:
        row.peak_extra_bytes = int(accel.max_memory_allocated(device) - before)
    else:
        row.peak_extra_bytes = _peak(events)
    row.allocations = sum(1 for _, delta in events if delta > 0)
    storages = {_storage(t) for t in _tensors(result)}
    row.shares_input_storage = any(ptr in inputs for ptr, _ in storages)
    row.result_bytes = sum(size for ptr, size in storages if ptr not in inputs)
    del result
    if job.grad:
        row.saved_bytes, row.saved = _saved(op, x, inputs)
    # Time: a warm-up run, then repeats (more for fast operations), synchronised.
    _sync(device)
    times: list[float] = []
    deadline = time.perf_counter() + MIN_TIMED_S
    while len(times) < job.repeats or (time.perf_counter() < deadline and len(times) < 1000):
        started = time.perf_counter()
        out = op.run(x)
        _sync(device)
        times.append(time.perf_counter() - started)
        del out
    row.median_s = statistics.median(times)
    element = torch.empty((), dtype=dtype).element_size()
    if op.flops is not None and row.median_s > 0:
        row.rate, row.rate_unit = op.flops(job.size) / row.median_s, "FLOP/s"
    elif op.traffic is not None and row.median_s > 0:
        moved = op.traffic * job.size * job.size * element
        row.rate, row.rate_unit = moved / row.median_s, "B/s"
    if not op.why:
        row.why = _why(row, job.size * job.size * element)


def _profiled(op: Operation, x: dict[str, Any], device: Any) -> tuple[Any, list[tuple[float, int]]]:
    """Run once under the profiler; the result and the (time, bytes) of every allocation
    (positive) and free (negative) on the row's device, in order."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    # The profiler's warnings are not the lab's output.
    with (
        contextlib.redirect_stderr(io.StringIO()),
        profile(activities=activities, profile_memory=True) as prof,
    ):
        result = op.run(x)
        _sync(device)
    attr = "self_cpu_memory_usage" if device.type == "cpu" else "self_device_memory_usage"
    events = [
        (e.time_range.start, int(getattr(e, attr, 0) or 0))
        for e in prof.events()
        if getattr(e, attr, 0)
    ]
    return result, sorted(events)


def warm_up() -> None:
    """Start and stop the profiler once, with no operation in between: its first start
    takes seconds, which a forking worker then pays once instead of once a row."""
    from torch.profiler import ProfilerActivity, profile

    with (
        contextlib.redirect_stderr(io.StringIO()),
        profile(activities=[ProfilerActivity.CPU], profile_memory=True),
    ):
        pass


def _peak(events: list[tuple[float, int]]) -> int:
    """The highest running total of allocations minus frees."""
    total = peak = 0
    for _, delta in events:
        total += delta
        peak = max(peak, total)
    return peak


def _saved(op: Operation, x: dict[str, Any], inputs: set[int]) -> tuple[int, list[str]]:
    """Bytes autograd saves for backward beyond the inputs, and a name for each tensor it
    saves (an input's name, or the shape and size of an intermediate)."""
    import torch

    names = {_storage(t)[0]: n for n, t in x.items()}
    seen: dict[int, str] = {}
    extra = 0

    def pack(t: Any) -> Any:
        nonlocal extra
        ptr, size = _storage(t)
        if ptr not in seen:
            if ptr in inputs:
                seen[ptr] = f"{names.get(ptr, 'input')} (input)"
            else:
                extra += size
                seen[ptr] = f"{tuple(t.shape)} {t.dtype} intermediate, {size:,} B"
        # Not the tensor: a graph that saves its own output would hold it in a cycle no
        # collector sees into, and its inputs with it. This graph never runs backward.
        return ptr

    def unpack(_: Any) -> Any:
        raise RuntimeError("the memory lab's graph is measured, not run backward")

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = op.run(x)
    del out
    return extra, list(seen.values())


def _why(row: Row, input_bytes: int) -> str:
    """A sentence for an expression's row, from what was measured."""
    if row.shares_input_storage and not row.result_bytes:
        return "the result shares an input's storage (a view, or written in place)"
    parts = []
    if row.result_bytes:
        ratio = row.result_bytes / input_bytes
        parts.append(f"the result owns {ratio:.3g}x an input's bytes")
    if row.peak_extra_bytes and row.result_bytes is not None:
        temporary = row.peak_extra_bytes - row.result_bytes
        if temporary > 0.01 * input_bytes:
            parts.append(
                f"temporaries held {temporary / input_bytes:.3g}x an input's bytes more at "
                "the peak (each intermediate of an expression is a tensor of its own)"
            )
    return "; ".join(parts)


__all__ = ["EXPRESSION_INPUTS", "Job", "Row", "measure"]
