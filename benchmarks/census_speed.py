"""Speed of a census: 100,000 tensors among 1,000,000 other gc-tracked objects.

Prints the census time as a ratio to a bare ``gc.get_objects()`` + ``isinstance`` pass
over the same heap, measured side by side in one run (median of ``--repeat`` runs each).
Target: <= 2.0x.

    .venv/bin/python benchmarks/census_speed.py [--tensors 100000] [--objects 1000000]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import time
from collections import deque
from operator import attrgetter

import report
import torch

from torchmem.tensors.walk import take_census


def bare_pass() -> int:
    Tensor = torch.Tensor
    return sum(1 for o in gc.get_objects() if isinstance(o, Tensor))


def tutorial_loop() -> float:
    """The loop tutorials teach for finding tensors (every gc object, ``torch.is_tensor``
    or a ``.data`` that is one, its type and size printed), printing to /dev/null; seconds."""
    t = time.perf_counter()
    with open(os.devnull, "w") as out:
        for obj in gc.get_objects():
            try:
                if torch.is_tensor(obj) or (hasattr(obj, "data") and torch.is_tensor(obj.data)):
                    print(type(obj), obj.size(), file=out)
            except Exception:  # what the tutorials do too: some objects raise on getattr
                pass
    return time.perf_counter() - t


def memlab_report() -> float | None:
    """pytorch-memlab's ``MemReporter().report()`` over the same heap (every tensor, by
    storage), printing to /dev/null; seconds, or None when it is not installed."""
    import contextlib
    import importlib.util
    import io

    if importlib.util.find_spec("pytorch_memlab") is None:
        return None
    with contextlib.redirect_stdout(io.StringIO()):
        from pytorch_memlab import MemReporter

        t = time.perf_counter()
        with open(os.devnull, "w") as out, contextlib.redirect_stdout(out):
            MemReporter().report()
        return time.perf_counter() - t


def field_floor() -> float:
    """The least a Python census can cost: the gc pass, then only reading the fields a
    census reports, each column in one C-level ``map`` (no Python code per tensor, no
    entry built, nothing named). Returns seconds."""
    gc.disable()  # as the census does: its allocations set off no collection
    t = time.perf_counter()
    Tensor = torch.Tensor
    tensors = [o for o in gc.get_objects() if isinstance(o, Tensor)]
    columns = [
        map(torch._C._storage_address, tensors),
        map(attrgetter("layout"), tensors),
        map(attrgetter("is_meta"), tensors),
        map(attrgetter("is_nested"), tensors),
        map(tuple, map(attrgetter("shape"), tensors)),
        map(Tensor.stride, tensors),
        map(Tensor.storage_offset, tensors),
        map(Tensor.element_size, tensors),
        map(Tensor.numel, tensors),
        map(Tensor.is_contiguous, tensors),
        map(attrgetter("dtype"), tensors),
        map(attrgetter("requires_grad"), tensors),
        map(attrgetter("grad_fn"), tensors),
        map(attrgetter("_base"), tensors),
    ]
    for column in columns:
        deque(column, maxlen=0)
    # One storage object per storage, for its device, data pointer and size.
    storages = list(map(Tensor.untyped_storage, tensors[: len(tensors) * 2 // 3]))
    deque(map(attrgetter("device"), storages), maxlen=0)
    deque(map(torch.UntypedStorage.data_ptr, storages), maxlen=0)
    deque(map(torch.UntypedStorage.nbytes, storages), maxlen=0)
    seconds = time.perf_counter() - t
    gc.enable()
    return seconds


def reuse_floor() -> float:
    """The least a census that reuses the previous one's entries can cost: the gc pass,
    then only the columns that tell whether an entry still holds (each tensor's version
    counter, StorageImpl, requires_grad, shape, stride and offset: ``t.data = x`` changes
    the last four without bumping the version), and the storages' fields, read afresh
    since a storage can be resized in place. No names, no entries, no bookkeeping.
    Returns seconds."""
    gc.disable()
    t = time.perf_counter()
    Tensor = torch.Tensor
    tensors = [o for o in gc.get_objects() if isinstance(o, Tensor)]
    columns = [
        map(attrgetter("_version"), tensors),
        map(torch._C._storage_address, tensors),
        map(attrgetter("requires_grad"), tensors),
        map(attrgetter("shape"), tensors),
        map(Tensor.stride, tensors),
        map(Tensor.storage_offset, tensors),
    ]
    for column in columns:
        deque(column, maxlen=0)
    storages = list(map(Tensor.untyped_storage, tensors[: len(tensors) * 2 // 3]))
    deque(map(torch.UntypedStorage.data_ptr, storages), maxlen=0)
    deque(map(torch.UntypedStorage.nbytes, storages), maxlen=0)
    seconds = time.perf_counter() - t
    gc.enable()
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tensors", type=int, default=100_000)
    p.add_argument("--objects", type=int, default=1_000_000)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    # A realistic mix: tensors in a list (named by the script's variables), a third of
    # them views of others, and a million unrelated Python objects (dicts and lists).
    base = [torch.zeros(16) for _ in range(args.tensors * 2 // 3)]
    views = [b[4:] for b in base[: args.tensors - len(base)]]
    others = [{} if i % 2 else [] for i in range(args.objects)]
    namespace = [("", {"base": base, "views": views})]
    holding = [("", {"base": base, "views": views, "samples": others})]
    gc.collect()
    rows = []
    census = None
    for _ in range(args.repeat):
        # The previous census is dropped first: every pass walks the same heap (a census
        # alive would add a quarter of a million objects to the next pass).
        census = None
        t = time.perf_counter()
        found = bare_pass()
        bare = time.perf_counter() - t
        floor = field_floor()
        again = reuse_floor()
        t = time.perf_counter()
        census = take_census(namespace)
        full = time.perf_counter() - t
        # A script that also keeps the million objects in a variable (a data set of
        # samples): the census looks into its containers for tensors.
        census = None
        t = time.perf_counter()
        take_census(holding)
        held = time.perf_counter() - t
        # A script whose variables do not reach the tensors (a list deep in an object, an
        # attached process's library state): every name comes from what holds them.
        t = time.perf_counter()
        take_census([])
        by_holders = time.perf_counter() - t
        rows.append((bare, floor, full, held, again, by_holders))
    bare, floor, full, held, again, by_holders = (
        statistics.median(r[i] for r in rows) for i in range(6)
    )
    # The peers, once each (the tutorial loop prints a line per tensor; MemReporter too).
    census = None
    tutorial = tutorial_loop()
    memlab = memlab_report()
    census = take_census(namespace)
    n_tensors = sum(len(s.tensors) for s in census.storages.values())
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}")
    print(
        f"heap: {len(gc.get_objects()):,} gc objects, {found:,} tensors "
        f"({len(census.storages):,} storages); census saw {n_tensors:,} tensors, "
        f"{100 * census.named_share():.1f}% of bytes named"
    )
    print(f"{'pass':<42} {'median':>10} {'ratio':>7}")
    for label, seconds in (
        ("gc.get_objects() + isinstance", bare),
        ("floor: gc pass + reading the fields", floor),
        ("reuse floor: gc pass + checking entries", again),
        ("torchmem census", full),
        ("census, the million in a script variable", held),
        ("census, names only from holders", by_holders),
        ("tutorials' gc.get_objects() loop (prints)", tutorial),
        ("pytorch-memlab MemReporter().report()", memlab),
    ):
        if seconds is None:
            print(f"{label:<42} {'not installed':>18}")
            continue
        print(f"{label:<42} {seconds * 1000:>8.0f} ms {seconds / bare:>7.2f}")
    how = (
        f"{found:,} tensors among {args.objects:,} objects, median of {args.repeat}, "
        "against a bare gc.get_objects() + isinstance pass"
    )
    report.row("census / bare gc pass", f"{full / bare:.2f}x", "<= 5x", full / bare <= 5, how)
    report.row("census, names only from what holds the tensors / bare gc pass",
               f"{by_holders / bare:.2f}x", "", None, "no script variables: each tensor "
               "named by its list's index (was quadratic: 80 s here)")  # fmt: skip
    report.row("floor (reading the fields only) / bare gc pass", f"{floor / bare:.2f}x", "",
               None, "the least a census in Python can cost: the target's reference")  # fmt: skip
    report.row(
        "reuse floor (checking entries only) / bare gc pass",
        f"{again / bare:.2f}x",
        "<= 2x",
        again / bare <= 2,
        "a repeated census that reused every entry would still read this much: "
        "fingerprint columns and storages, no names (docs/benchmarks.md)",
    )
    report.row(
        "tutorials' gc.get_objects() loop / bare gc pass",
        f"{tutorial / bare:.2f}x",
        "",
        None,
        "type and size of each tensor printed; no names, no views, no sum",
    )
    if memlab is not None:
        report.row("pytorch-memlab MemReporter / bare gc pass", f"{memlab / bare:.2f}x", "",
                   None, "every tensor by storage, sizes summed per device; names only for "
                   "a model's parameters and grads when given the model")  # fmt: skip
    del others


if __name__ == "__main__":
    main()
