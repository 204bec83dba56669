"""An out-of-memory error, explained: what was asked for, what held the memory, what to try.

Built from a Session whose run ended out of memory: the error's message (PyTorch says how
much it tried to allocate, and on CUDA how much was allocated and reserved), the last
readings of the device, and the census taken from the frames of the error's traceback
(``trigger == "oom"``; the latest census otherwise). The suggestions follow the figures:
activations that dominate call for checkpointing or mixed precision, optimizer state for
an 8-bit or offloaded optimizer, a large reserved-but-unallocated share for
``expandable_segments``; a smaller batch always helps, and the Tune panel finds it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from torchmem.events import CensusTaken, RunStatus
from torchmem.series import split_key
from torchmem.session import Session
from torchmem.tensors.model import KIND_LABELS
from torchmem.units import format_bytes, parse_bytes

#: How many of the largest storages a report names.
TOP_STORAGES = 10

_TRIED = re.compile(r"tried to allocate ([0-9.]+\s*[KMGT]?i?B)", re.IGNORECASE)
_TRIED_BYTES = re.compile(r"tried to allocate (\d+) bytes", re.IGNORECASE)
_GPU = re.compile(r"GPU (\d+)")


@dataclass
class Suggestion:
    """One thing to try: ``key`` names the action a front end may offer a button for
    (``tune``, ``expandable_segments``, ``mixed_precision``, ``checkpointing``,
    ``optimizer``, ``leak``)."""

    key: str
    text: str


@dataclass
class OomReport:
    """What an out-of-memory error was about (plain data, for the window and the CLI)."""

    device: str
    message: str
    requested_bytes: int | None = None
    allocated_bytes: float | None = None
    reserved_bytes: float | None = None
    capacity_bytes: int | None = None
    #: Bytes in split cached blocks the allocator could not hand out whole (CUDA).
    inactive_split_bytes: float | None = None
    largest: list[tuple[str, str, int]] = field(default_factory=list)  # name, kind, bytes
    by_kind: dict[str, int] = field(default_factory=dict)
    census_trigger: str = ""
    suggestions: list[Suggestion] = field(default_factory=list)

    @property
    def unallocated_reserved(self) -> float | None:
        """Reserved by the allocator but not in use: fragmentation, on accelerators."""
        if self.allocated_bytes is None or self.reserved_bytes is None:
            return None
        return max(0.0, self.reserved_bytes - self.allocated_bytes)

    def lines(self) -> list[str]:
        """The report as text, a fact per line."""
        out = [f"Out of memory on {self.device}: {self.message}"]
        if self.requested_bytes is not None:
            out.append(f"  asked for      {format_bytes(self.requested_bytes)}")
        if self.allocated_bytes is not None:
            what = "process RSS " if self.device == "cpu" else "allocated   "
            out.append(f"  {what}   {format_bytes(self.allocated_bytes)}")
        if self.reserved_bytes is not None:
            gap = self.unallocated_reserved or 0.0
            out.append(
                f"  reserved       {format_bytes(self.reserved_bytes)} "
                f"({format_bytes(gap)} reserved but unallocated)"
            )
        if self.inactive_split_bytes:
            out.append(f"  inactive split {format_bytes(self.inactive_split_bytes)}")
        if self.capacity_bytes:
            out.append(f"  device total   {format_bytes(self.capacity_bytes)}")
        if self.by_kind:
            kinds = ", ".join(
                f"{KIND_LABELS.get(k, k)} {format_bytes(v)}"
                for k, v in sorted(self.by_kind.items(), key=lambda kv: -kv[1])
                if v
            )
            out.append(f"  tensors by kind: {kinds}")
        if self.largest:
            where = "when it failed" if self.census_trigger == "oom" else "at the last census"
            out.append(f"  largest storages {where}:")
            out += [f"    {format_bytes(b):>11}  {name} ({kind})" for name, kind, b in self.largest]
        if self.suggestions:
            out.append("  try:")
            out += [f"    - {s.text}" for s in self.suggestions]
        return out

    def to_json(self) -> dict[str, Any]:
        """The report as a summary's ``oom`` key writes it."""
        return {
            "device": self.device,
            "requested_bytes": self.requested_bytes,
            "allocated_bytes": None if self.allocated_bytes is None else int(self.allocated_bytes),
            "reserved_bytes": None if self.reserved_bytes is None else int(self.reserved_bytes),
            "largest": [{"name": n, "kind": k, "bytes": b} for n, k, b in self.largest],
            "by_kind": dict(self.by_kind),
            "suggestions": [{"key": s.key, "text": s.text} for s in self.suggestions],
        }


def requested_bytes(text: str) -> int | None:
    """The size an OOM message says was asked for (``Tried to allocate 2.00 GiB``)."""
    match = _TRIED_BYTES.search(text)
    if match:
        return int(match.group(1))
    match = _TRIED.search(text)
    if match:
        try:
            return parse_bytes(match.group(1))
        except ValueError:
            return None
    return None


def explain_oom(session: Session) -> OomReport | None:
    """The report of the run ``session`` holds, or None unless it ended out of memory
    (the device's total from the capacity its sources reported)."""
    finished = session.run_finished
    if finished is None or finished.status is not RunStatus.OOM:
        return None
    # The error's own words, not torchmem's advice after them (which names CUDA too).
    first = finished.message.split(". Try a smaller")[0]
    if first.startswith("out of memory (") and first.endswith(")"):
        first = first[len("out of memory (") : -1]
    device = _device_of(first)
    accelerator = device != "cpu"
    report = OomReport(device=device, message=first, requested_bytes=requested_bytes(first))
    latest = session.latest()
    if accelerator:
        report.allocated_bytes = _reading(latest, device, "allocated")
        report.reserved_bytes = _reading(latest, device, "reserved")
        report.inactive_split_bytes = _reading(latest, device, "inactive_split")
    else:
        report.allocated_bytes = _reading(latest, "cpu", "rss")
    report.capacity_bytes = session.capacity().get(device)
    census = _oom_census(session)
    if census is not None:
        report.census_trigger = census.trigger
        storages = [s for s in census.census.storages.values() if s.device == device] or list(
            census.census.storages.values()
        )
        storages.sort(key=lambda s: s.nbytes, reverse=True)
        report.largest = [(s.name, s.kind, s.nbytes) for s in storages[:TOP_STORAGES]]
        report.by_kind = census.census.bytes_by_kind(device if accelerator else "cpu")
    report.suggestions = _suggestions(report, session, accelerator)
    return report


def _device_of(error: str) -> str:
    lowered = error.lower()
    for kind in ("cuda", "xpu", "mps"):
        if kind in lowered:
            gpu = _GPU.search(error)
            return f"{kind}:{gpu.group(1) if gpu else 0}" if kind != "mps" else "mps"
    return "cpu"


def _reading(latest: dict[str, tuple[float, float]], device: str, metric: str) -> float | None:
    for key, (last, peak) in latest.items():
        if split_key(key) == (device, metric):
            # The reading after the failure is what was left; the peak is what it reached.
            return max(last, peak)
    return None


def _oom_census(session: Session) -> CensusTaken | None:
    census, previous = session.censuses()
    for candidate in (census, previous):
        if candidate is not None and candidate.trigger == "oom":
            return candidate
    return census


def _suggestions(report: OomReport, session: Session, accelerator: bool) -> list[Suggestion]:
    total = sum(report.by_kind.values())
    share = {k: v / total for k, v in report.by_kind.items()} if total else {}
    out = [
        Suggestion(
            "tune",
            "a smaller batch size: Tune (Ctrl+B, or `torchmem tune`) finds the largest that "
            "fits, in a few trials",
        )
    ]
    gap = report.unallocated_reserved
    if (
        accelerator
        and gap is not None
        and report.reserved_bytes
        and gap > 0.1 * report.reserved_bytes
    ):
        out.append(
            Suggestion(
                "expandable_segments",
                f"{format_bytes(gap)} was reserved but unallocated (fragmentation): run with "
                "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
            )
        )
    if share.get("activation", 0.0) > 0.3:
        out.append(
            Suggestion(
                "checkpointing",
                f"activations held {share['activation']:.0%} of the tensor memory: activation "
                "checkpointing (torch.utils.checkpoint) trades them for recomputation",
            )
        )
    if share.get("optimizer_state", 0.0) > 0.25:
        out.append(
            Suggestion(
                "optimizer",
                f"optimizer state held {share['optimizer_state']:.0%}: an 8-bit optimizer "
                "(bitsandbytes), ZeRO / FSDP sharding, or CPU offload shrinks it",
            )
        )
    out.append(
        Suggestion(
            "mixed_precision",
            "mixed precision (torch.autocast with bfloat16 or float16) halves activations",
        )
    )
    if any(a.kind.value in ("leak", "epoch_growth") for a in session.alert_list()):
        out.append(
            Suggestion(
                "leak",
                "memory grew step after step before the failure: see the leak alert, which "
                "names the tensors that grew",
            )
        )
    return out
