"""The script a ``torchmem.tune(step_fn)`` trial runs, in a fresh process.

A step function that lives in an importable module is sent by reference
(``package.module:function``): each trial is then ``torchmem run --max-steps`` on this
file, exactly like a script's trial, with the same agent, summary and out-of-memory
handling. It imports the function and calls it with the trial's batch size until the
run has made its steps; each call is a step, whether or not it steps an optimizer (an
evaluation or inference function is tuned too).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchmem.probe.steps import current_tracker


def resolve(target: str) -> Callable[[int], Any]:
    """The object ``module:qualified.name`` names; ValueError saying what is missing."""
    module_name, _, qualname = target.partition(":")
    if not module_name or not qualname:
        raise ValueError(f"not a function reference: {target!r} (expected module:function)")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{module_name} has no {qualname}") from None
    if not callable(obj):
        raise ValueError(f"{target} is not callable")
    return obj


def main(argv: list[str] | None = None) -> None:
    """Parse the trial's arguments, import the function, and call it."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True, help="module:function")
    parser.add_argument("--sys-path", default="", help="import paths of the caller")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--calls", type=int, default=4)
    opts = parser.parse_args(argv)
    # torchmem run put this file's folder first on sys.path: its modules (model, search,
    # trial) would shadow the user's own of the same names.
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if not p or Path(p).resolve() != here]
    for entry in reversed([p for p in opts.sys_path.split(os.pathsep) if p]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    fn = resolve(opts.target)
    tracker = current_tracker()
    for _ in range(opts.calls):
        before = tracker.steps if tracker is not None else 0
        fn(opts.batch_size)
        if tracker is not None and tracker.steps == before:
            tracker.end_step()  # a call that stepped no optimizer is one step all the same


if __name__ == "__main__":
    main()
