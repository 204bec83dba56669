"""torchmem: a live monitor for PyTorch memory.

``import torchmem`` gives the core API only and never imports Qt, so it is safe inside a
training process::

    import torchmem
    torchmem.mark("epoch 2")   # a marker on the traces (a no-op outside torchmem)
"""

from __future__ import annotations

__version__ = "0.1.0"

import sys as _sys
from typing import TYPE_CHECKING as _TYPE_CHECKING
from typing import Any as _Any

from torchmem.probe.steps import mark

if _TYPE_CHECKING:
    from torchmem.tensors.model import Census
    from torchmem.tuning.search import TuneResult


def census(referrers: bool = True) -> Census:
    """Every live tensor of this process, grouped by storage, with names and exact sizes.

    Variables of the calling code (and of ``__main__``) name the tensors they hold::

        c = torchmem.census()
        print(c.total_bytes("cpu"), c.naive_bytes("cpu"))
    """
    from torchmem.tensors.namespaces import script_namespaces
    from torchmem.tensors.walk import take_census

    caller = _sys._getframe(1)
    namespaces = [("", dict(caller.f_locals)), ("", caller.f_globals)]
    namespaces += script_namespaces(None, caller.f_code.co_filename)
    return take_census(namespaces, referrers=referrers)


def serve(hz: float = 10.0, listen: str | None = None, label: str = "") -> _Any:
    """Let torchmem attach to this process: one line at the top of a training script.

    ``torchmem ps`` lists it and the window's Attach dialog (or ``torchmem attach PID``)
    connects to it. Returns the published entry. Safe to call more than once.
    """
    from torchmem.serve import serve as _serve

    return _serve(hz, listen, label)


def tune(step_fn: _Any, **options: _Any) -> TuneResult:
    """The largest batch size for which ``step_fn(batch_size)``, one training step,
    stays under a memory budget: a few trials, a fitted model, a verified answer::

        result = torchmem.tune(train_step, budget="8GiB", device="cuda:0")
        print(result)   # the recommendation and its reasons
        result.recommended

    Trials run in child processes; see :func:`torchmem.tuning.function.tune` for the
    options (range, budget, headroom, steps, rounding, isolation).
    """
    from torchmem.tuning.function import tune as _tune

    return _tune(step_fn, **options)


__all__ = ["__version__", "census", "mark", "serve", "tune"]
