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

import torch

from torchmem.tensor_census import take_census


def bare_pass() -> int:
    Tensor = torch.Tensor
    return sum(1 for o in gc.get_objects() if isinstance(o, Tensor))


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
    gc.collect()
    rows = []
    census = None
    for _ in range(args.repeat):
        # The previous census is dropped first: both passes walk the same heap (a census
        # alive would add a quarter of a million objects to the next bare pass).
        census = None
        t = time.perf_counter()
        found = bare_pass()
        bare = time.perf_counter() - t
        t = time.perf_counter()
        census = take_census(namespace)
        full = time.perf_counter() - t
        rows.append((bare, full))
    bare = statistics.median(r[0] for r in rows)
    full = statistics.median(r[1] for r in rows)
    n_tensors = sum(len(s.tensors) for s in census.storages.values())
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}")
    print(
        f"heap: {len(gc.get_objects()):,} gc objects, {found:,} tensors "
        f"({len(census.storages):,} storages); census saw {n_tensors:,} tensors, "
        f"{100 * census.named_share():.1f}% of bytes named"
    )
    print(f"{'pass':<40} {'median':>10} {'ratio':>7}")
    print(f"{'gc.get_objects() + isinstance':<40} {bare * 1000:>8.0f} ms {1.0:>7.2f}")
    print(f"{'torchmem census':<40} {full * 1000:>8.0f} ms {full / bare:>7.2f}")
    del others


if __name__ == "__main__":
    main()
