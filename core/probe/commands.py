"""User actions on the monitored process, each measured: what did it change?

Each command reads the counters before and after and returns a :class:`CommandResult`
whose message says what changed, e.g. ``gc.collect: 3,102 objects collected, RSS -84.2 MiB``.
These run only when a user asks; the sampler never calls them on its own.
"""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchmem.events import CommandResult
from torchmem.probe.backends import MemoryBackend
from torchmem.probe.heap import trim_heap
from torchmem.probe.sampler import read_backends
from torchmem.series import series_label, split_key
from torchmem.units import format_bytes


@dataclass(frozen=True)
class Command:
    """A request a viewer may send to a monitored process, as every front end names it.

    ``measured`` commands are run by the source's :meth:`command` and answered with a
    :class:`CommandResult` event that says what changed; the others (stop, mark,
    referrers) are answered directly.
    """

    name: str
    label: str
    measured: bool = True


#: Every command, once: the agent accepts exactly these, the window labels them from here.
COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        Command("gc_collect", "gc.collect()"),
        Command("empty_cache", "empty_cache()"),
        Command("reset_peaks", "Reset peaks"),
        Command("census", "Census of live tensors"),
        # Recording and saving CUDA allocation history (for PyTorch's memory_viz).
        Command("history_start", "Start recording CUDA allocation history"),
        Command("history_stop", "Stop recording CUDA allocation history"),
        Command("snapshot", "Memory snapshot"),
        Command("stop", "Stop at the next step", measured=False),
        Command("mark", "Mark", measured=False),
        Command("referrers", "What holds a tensor", measured=False),
    )
}
#: Allocation events kept while recording (PyTorch keeps the newest).
HISTORY_ENTRIES = 100_000
_NO_HISTORY = (
    "allocation history records CUDA allocations, and this process has not used CUDA "
    "(yet): start recording once the script has put something on the GPU"
)


def _deltas(
    before: dict[str, float], after: dict[str, float], metrics: set[str]
) -> dict[str, float]:
    return {
        key: after[key] - before[key]
        for key in after
        if key in before and split_key(key)[1] in metrics
    }


def _describe(deltas: dict[str, float], always: tuple[str, ...] = ()) -> str:
    parts = [
        f"{series_label(key).replace('process RSS', 'RSS')} {format_bytes(d, signed=True)}"
        for key, d in deltas.items()
        if d != 0 or key in always
    ]
    return ", ".join(parts)


def gc_collect(backends: Sequence[MemoryBackend], now: Callable[[], float]) -> CommandResult:
    """Run a full ``gc.collect()``, give the C heap's free pages back (glibc keeps what
    Python frees, so RSS read "0 B" freed after a run's garbage went), and report objects
    collected and memory freed."""
    before = read_backends(backends)
    started = time.perf_counter()
    collected = gc.collect()
    trimmed = trim_heap()
    took = time.perf_counter() - started
    after = read_backends(backends)
    deltas = _deltas(before, after, {"rss", "allocated"})
    changes = _describe(deltas, always=("cpu/rss",))
    message = f"gc.collect: {collected:,} objects collected in {took * 1000:.0f} ms"
    if trimmed:
        message += " (then malloc_trim)"
    if changes:
        message += f", {changes}"
    return CommandResult(now(), "gc_collect", True, message, {"collected": collected, **deltas})


def empty_cache(backends: Sequence[MemoryBackend], now: Callable[[], float]) -> CommandResult:
    """Return the accelerators' cached, unused memory to the device."""
    accelerators = [b for b in backends if b.is_accelerator]
    if not accelerators:
        return CommandResult(
            now(), "empty_cache", False, "empty_cache: no accelerator in this process"
        )
    before = read_backends(accelerators)
    for backend in accelerators:
        backend.empty_cache()
    after = read_backends(accelerators)
    deltas = _deltas(before, after, {"reserved"})
    released = [
        f"{series_label(k)} {format_bytes(d, signed=True)} (now {format_bytes(after[k])})"
        for k, d in deltas.items()
        if d
    ]
    message = "empty_cache: " + (", ".join(released) if released else "nothing cached to release")
    return CommandResult(now(), "empty_cache", True, message, deltas)


def reset_peaks(
    backends: Sequence[MemoryBackend],
    now: Callable[[], float],
    session_peaks: dict[str, float] | None = None,
) -> CommandResult:
    """Reset accelerator peak statistics and say what the old peaks were.

    ``session_peaks`` (series key -> peak) covers figures the Session tracks itself, such
    as the RSS peak; the Session resets those when it receives the result.
    """
    accelerators = [b for b in backends if b.is_accelerator]
    before = read_backends(accelerators)
    for backend in accelerators:
        backend.reset_peaks()
    after = read_backends(backends)
    parts = [
        f"{series_label(k)} {format_bytes(v)} -> {format_bytes(after[k])}"
        for k, v in before.items()
        if k.endswith("/peak_allocated") and k in after
    ]
    for key, peak in (session_peaks or {}).items():
        if key == "cpu/rss" and key in after:
            parts.append(f"RSS peak {format_bytes(peak)} -> {format_bytes(after[key])}")
    message = "Reset peaks: " + (", ".join(parts) if parts else "nothing to reset yet")
    return CommandResult(now(), "reset_peaks", True, message)


def _recorder(backends: Sequence[MemoryBackend]) -> MemoryBackend | None:
    # PyTorch records and snapshots every CUDA device at once, through one backend.
    return next((b for b in backends if b.records_history), None)


def allocation_history(
    backends: Sequence[MemoryBackend], now: Callable[[], float], record: bool
) -> CommandResult:
    """Start (``record``) or stop recording CUDA allocations with their Python stacks.

    PyTorch then keeps the newest :data:`HISTORY_ENTRIES` allocation and free events;
    :func:`save_snapshot` writes them out. Recording costs the training loop a stack
    capture per allocation, so it stays off until a user asks.
    """
    name = "history_start" if record else "history_stop"
    recorder = _recorder(backends)
    if recorder is None:
        return CommandResult(now(), name, False, _NO_HISTORY)
    try:
        recorder.record_history(HISTORY_ENTRIES if record else None)
    except Exception as exc:  # a torch build without it raises RuntimeError
        return CommandResult(now(), name, False, f"allocation history: {exc}")
    message = (
        f"recording CUDA allocation history (the newest {HISTORY_ENTRIES:,} events, with "
        "Python stacks; it slows allocation a little): save a snapshot to see it"
        if record
        else "stopped recording CUDA allocation history"
    )
    return CommandResult(now(), name, True, message)


def save_snapshot(
    backends: Sequence[MemoryBackend],
    now: Callable[[], float],
    folder: Path,
    names: Callable[[], list[dict[str, Any]]] | None = None,
) -> CommandResult:
    """Write a CUDA memory snapshot (segments, blocks, recorded history) into ``folder``,
    for https://pytorch.org/memory_viz, and beside it (``names_path``) what ``names``
    gives: the tensor names of the run's censuses, which the snapshot viewer matches to
    allocations by address and time (memory_viz knows stacks only)."""
    recorder = _recorder(backends)
    if recorder is None:
        return CommandResult(now(), "snapshot", False, _NO_HISTORY)
    path = folder / f"snapshot-{os.getpid()}-{time.strftime('%Y%m%d-%H%M%S')}.pickle"
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        recorder.dump_snapshot(str(path))
        size = path.stat().st_size
    except OSError as exc:
        return CommandResult(
            now(), "snapshot", False, f"cannot write a snapshot in {folder}: {exc.strerror}"
        )
    except Exception as exc:
        return CommandResult(now(), "snapshot", False, f"snapshot: {exc}")
    message = (
        f"memory snapshot written to {path} ({format_bytes(size)}): drop it on "
        "https://pytorch.org/memory_viz (it holds allocation stacks only while history "
        "is recorded)"
    )
    censuses = names() if names is not None else []
    if censuses:
        try:
            _write_json(names_path(path), {"version": 1, "censuses": censuses})
            named = sum(len(c["storages"]) for c in censuses)
            message += f"; the names of {named:,} tensors from the run's censuses beside it"
        except OSError as exc:
            message += f"; the tensor names could not be written ({exc.strerror})"
    return CommandResult(now(), "snapshot", True, message, output=str(path))


def names_path(snapshot: str | os.PathLike[str]) -> Path:
    """Where the tensor names of a snapshot written by torchmem are kept."""
    return Path(snapshot).with_suffix(".names.json")


def _write_json(path: Path, data: object) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, separators=(",", ":")))
    tmp.replace(path)


def snapshot_dir() -> Path:
    """Where snapshots go: ``$TORCHMEM_SNAPSHOT_DIR``, else the user's data directory."""
    configured = os.environ.get("TORCHMEM_SNAPSHOT_DIR")
    if configured:
        return Path(configured).expanduser()
    import platformdirs

    return platformdirs.user_data_path("torchmem", appauthor=False) / "snapshots"
