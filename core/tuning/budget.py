"""The memory a tuning run may use: the budget, its default, and the headroom.

Shared by ``torchmem tune``, the Tune panel and ``torchmem.tune()``, so that the three
agree on what "fits" means.
"""

from __future__ import annotations

import psutil

from torchmem.probe import nvml
from torchmem.probe.devices import device_problem
from torchmem.tuning.search import TuneError
from torchmem.units import format_bytes, parse_bytes


def default_budget(device: str) -> int:
    """Half of the RAM available now (CPU), or the device's free memory (NVML, so that
    asking creates no CUDA context here). TuneError when it cannot be known."""
    if device == "cpu":
        return psutil.virtual_memory().available // 2
    if device.partition(":")[0] == "cuda":
        memory = nvml.device_memory(device)
        if memory is None:
            raise TuneError(f"cannot read the free memory of {device} (NVML): give a budget")
        return memory[0]
    raise TuneError(f"no default budget for {device}: give a budget")


def budget_bytes(value: int | str | None, device: str) -> int:
    """A budget given as bytes or as text (``6GiB``), or the device's default;
    TuneError first when ``device`` is not on this machine (before any trial)."""
    problem = device_problem(device)
    if problem:
        raise TuneError(problem)
    if value is None or value == "":
        return default_budget(device)
    if isinstance(value, int):
        if value <= 0:
            raise TuneError(f"the budget must be positive, not {value}")
        return value
    try:
        return parse_bytes(value)
    except ValueError as exc:
        raise TuneError(str(exc)) from None


def headroom_bytes(text: str | int | None, budget: int, device: str) -> int:
    """``10%`` of the budget, a size (``1GiB`` or bytes), or the default: 10% on CPU,
    max(10%, 1 GiB) on accelerators (their allocator fragments). TuneError when the
    headroom would leave nothing of the budget."""
    if text is None or text == "":
        share = budget // 10
        room = share if device == "cpu" else max(share, 1 << 30)
    elif isinstance(text, int):
        room = text
    elif text.strip().endswith("%"):
        try:
            value = float(text.strip()[:-1])
        except ValueError:
            raise TuneError(f"not a percentage: {text!r}") from None
        if not 0 <= value < 100:
            raise TuneError(f"the headroom must be 0-99%, not {text}")
        room = int(budget * value / 100)
    else:
        try:
            room = parse_bytes(text)
        except ValueError as exc:
            raise TuneError(str(exc)) from None
    if room >= budget:
        raise TuneError(
            f"the headroom ({format_bytes(room)}) leaves nothing of the budget "
            f"({format_bytes(budget)})"
        )
    return room
