"""What a census is, as plain data: storages, the tensors that view them, and diffs.

:class:`Census` holds no tensor (a tensor a user asks about is found again by
:meth:`TensorInfo.alive`), so it travels to viewers, is kept in the Session and feeds the
leak detector's culprits; :mod:`torchmem.tensors.walk` is what takes one.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torchmem.tensors.heap import objects_of_types

KINDS = ("parameter", "buffer", "gradient", "optimizer_state", "activation", "plain")
KIND_LABELS = {
    "parameter": "parameters",
    "buffer": "buffers",
    "gradient": "gradients",
    "optimizer_state": "optimizer state",
    "activation": "activations / saved for backward",
    "plain": "other",
}
KIND_RANK = {k: i for i, k in enumerate(KINDS)}

StorageKey = tuple[str, int]


@dataclass(slots=True)
class TensorInfo:
    """One live tensor (or one part of a sparse tensor), as plain data."""

    name: str
    kind: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    dtype: str
    device: str
    numel: int
    element_size: int
    span_bytes: int
    is_view: bool
    is_contiguous: bool
    requires_grad: bool
    is_leaf: bool
    grad_fn: str
    pinned: bool
    storage_key: StorageKey
    names: tuple[str, ...] = ()
    named: bool = True

    def alive(self) -> Any:
        """Find this tensor again if it still exists (a strong reference: drop it soon).

        A census keeps no reference to tensors (not even weak ones, which cost more than
        the rest of a tensor's entry); one gc pass finds it on demand instead.
        """
        import torch

        (tensors,), _ = objects_of_types((torch.Tensor,))
        for obj in tensors:
            if (
                not obj.is_meta
                and obj.layout is torch.strided
                and str(obj.device) == self.device
                and tuple(obj.shape) == self.shape
                and obj.stride() == self.stride
                and obj.storage_offset() == self.storage_offset
                and obj.untyped_storage().data_ptr() == self.storage_key[1]
            ):
                return obj
        return None


@dataclass(slots=True)
class StorageInfo:
    """One storage (a block of memory) and every tensor that views it."""

    key: StorageKey
    nbytes: int
    tensors: list[TensorInfo] = field(default_factory=list)

    @property
    def device(self) -> str:
        """The device the storage lives on."""
        return self.key[0]

    @property
    def kind(self) -> str:
        """The most telling kind among its tensors (a parameter beats a view of it)."""
        return min((t.kind for t in self.tensors), key=KIND_RANK.__getitem__, default="plain")

    @property
    def name(self) -> str:
        """The best name among its tensors."""
        best = min(self.tensors, key=lambda t: (not t.named, KIND_RANK[t.kind], t.is_view))
        return best.name

    @property
    def named(self) -> bool:
        """True when at least one tensor on it has a real name."""
        return any(t.named for t in self.tensors)


@dataclass(slots=True)
class Skipped:
    """A tensor the census could not size, and why."""

    label: str
    reason: str


@dataclass
class CensusDiff:
    """What changed between two censuses."""

    new: list[StorageInfo]
    freed: list[StorageInfo]
    grown: list[tuple[StorageInfo, int]]

    @property
    def new_bytes(self) -> int:
        """Bytes of the new storages."""
        return sum(s.nbytes for s in self.new)

    @property
    def freed_bytes(self) -> int:
        """Bytes of the storages that are gone."""
        return sum(s.nbytes for s in self.freed)


@dataclass
class Census:
    """Every live storage of the process at one moment."""

    storages: dict[StorageKey, StorageInfo]
    skipped: list[Skipped]
    duration_s: float
    step: int = 0

    def tensors(self) -> Iterator[TensorInfo]:
        """Every tensor, storage by storage."""
        for storage in self.storages.values():
            yield from storage.tensors

    def devices(self) -> list[str]:
        """Devices that hold at least one storage, CPU first."""
        return sorted({s.device for s in self.storages.values()}, key=lambda d: (d != "cpu", d))

    def total_bytes(self, device: str | None = None) -> int:
        """Unique storage bytes (each storage once), on ``device`` or everywhere."""
        return sum(s.nbytes for s in self.storages.values() if device in (None, s.device))

    def naive_bytes(self, device: str | None = None) -> int:
        """What summing tensor sizes gives: views of one storage counted again."""
        return sum(
            t.span_bytes
            for s in self.storages.values()
            if device in (None, s.device)
            for t in s.tensors
        )

    def bytes_by_kind(self, device: str | None = None) -> dict[str, int]:
        """Unique bytes per kind (parameters, gradients, optimizer state, ...)."""
        out = dict.fromkeys(KINDS, 0)
        for s in self.storages.values():
            if device in (None, s.device):
                out[s.kind] += s.nbytes
        return out

    def named_share(self) -> float:
        """Share of the unique bytes that carry a real name (not a type+shape label)."""
        total = self.total_bytes()
        named = sum(s.nbytes for s in self.storages.values() if s.named)
        return named / total if total else 1.0

    def folded(self, top: int) -> Census:
        """This census with only its ``top`` largest storages kept as they are; the rest
        become one entry per device and kind, named ``(N smaller storages)``, so totals,
        bytes by kind and devices stay exact while the size stays bounded (a recording
        keeps every census this way)."""
        if len(self.storages) <= top:
            return self
        ranked = sorted(self.storages.values(), key=lambda s: s.nbytes, reverse=True)
        kept = {s.key: s for s in ranked[:top]}
        rest: dict[tuple[str, str], list[StorageInfo]] = {}
        for s in ranked[top:]:
            rest.setdefault((s.device, s.kind), []).append(s)
        for index, ((device, kind), group) in enumerate(sorted(rest.items()), start=1):
            nbytes = sum(s.nbytes for s in group)
            key = (device, -index)  # no real storage has a negative address
            label = f"({len(group):,} smaller storages)"
            kept[key] = StorageInfo(
                key,
                nbytes,
                [
                    TensorInfo(
                        name=label, kind=kind, shape=(nbytes,), stride=(1,),
                        storage_offset=0, dtype="uint8", device=device, numel=nbytes,
                        element_size=1, span_bytes=nbytes, is_view=False,
                        is_contiguous=True, requires_grad=False, is_leaf=True,
                        grad_fn="", pinned=False, storage_key=key, named=False,
                    )
                ],
            )  # fmt: skip
        return Census(kept, list(self.skipped), self.duration_s, self.step)

    def diff(self, previous: Census | None) -> CensusDiff:
        """Storages new, freed and grown since ``previous``."""
        if previous is None:
            return CensusDiff(list(self.storages.values()), [], [])
        new = [s for k, s in self.storages.items() if k not in previous.storages]
        freed = [s for k, s in previous.storages.items() if k not in self.storages]
        grown = [
            (s, s.nbytes - previous.storages[k].nbytes)
            for k, s in self.storages.items()
            if k in previous.storages and s.nbytes > previous.storages[k].nbytes
        ]
        return CensusDiff(new, freed, grown)


def describe_census(census: Census, previous: Census | None = None) -> str:
    """One line for the status bar: counts, bytes, changes since ``previous``, duration."""
    from torchmem.units import format_bytes

    n_tensors = sum(len(s.tensors) for s in census.storages.values())
    text = (
        f"Census: {n_tensors:,} tensors in {len(census.storages):,} storages, "
        f"{format_bytes(census.total_bytes())}"
    )
    if previous is not None:
        d = census.diff(previous)
        text += (
            f"; {len(d.new):,} new ({format_bytes(d.new_bytes)}), "
            f"{len(d.freed):,} freed ({format_bytes(d.freed_bytes)}) since the last one"
        )
    if census.skipped:
        text += f"; {len(census.skipped)} skipped"
    return text + f" (took {census.duration_s * 1000:.0f} ms)"
