"""Batch-size search: torchmem's against the peers' strategies, on models of known memory.

Each strategy searches the same synthetic training runs, whose peak memory is
``fixed + per_sample*b (+ quad*b²)`` with 1% noise and whose trials run out of memory
above the budget, so the true largest size is known exactly. Rows: trials, out-of-memory
trials, and the recommendation as a share of the true maximum (1.00 is perfect; above
1.00 would OOM later). The peers are faithful reference implementations, written from
their code and documentation (their own finders need a CUDA device to raise a real
out-of-memory error):

- Lightning ``Tuner.scale_batch_size(mode="power")``: double from the initial size until
  a trial fails, keep the last success (``max_trials=25``);
- Lightning ``mode="binsearch"``: double until a failure, then bisect between the last
  success and the failure until they are adjacent;
- Accelerate ``find_executable_batch_size``: start at the maximum and multiply by 0.9 on
  every out-of-memory error until one runs.

Usage: ``.venv/bin/python benchmarks/tune_search.py [--quick]``
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "core"))  # a plain checkout

import report

from torchmem.tuning.search import BatchSearch, Trial

MiB, GiB = 1 << 20, 1 << 30


@dataclass
class Case:
    """One training run's memory, and the budget it is tuned for."""

    name: str
    fixed: float
    per_sample: float
    limit: float
    quad: float = 0.0

    def peak(self, b: int) -> float:
        return self.fixed + self.per_sample * b + self.quad * b * b

    def true_max(self, cap: int) -> int:
        lo, hi = 0, cap
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.peak(mid) <= self.limit:
                lo = mid
            else:
                hi = mid - 1
        return lo


CASES = [
    Case("CNN on CPU, max near 3000", 300 * MiB, 2 * MiB, 6 * GiB),
    Case("large model, max near 470", 1.5 * GiB, 40 * MiB, 20 * GiB),
    Case("small max (4)", 5 * GiB, 1 * GiB, 9.5 * GiB),
    Case("attention, quadratic", 400 * MiB, 1 * MiB, 6 * GiB, quad=0.02 * MiB),
]


class Trials:
    """A run's trials: counts them, and fails those over the limit (the budget)."""

    def __init__(self, case: Case, seed: int) -> None:
        self.case = case
        self.rng = random.Random(seed)
        self.sizes: list[int] = []
        self.ooms = 0

    def fits(self, b: int) -> bool:
        self.sizes.append(b)
        ok = self.case.peak(b) * (1 + self.rng.uniform(-0.01, 0.01)) <= self.case.limit
        self.ooms += not ok
        return ok

    def measure(self, b: int, role: str, predicted: float | None) -> Trial:
        self.sizes.append(b)
        peak = self.case.peak(b) * (1 + self.rng.uniform(-0.01, 0.01))
        if peak > self.case.limit * 1.1:  # the budget: limit plus 10% headroom
            self.ooms += 1
            return Trial(b, int(peak), ok=False, oom=True)
        return Trial(b, int(peak), ok=True, oom=False)


def torchmem_search(trials: Trials, cap: int) -> int:
    return BatchSearch(trials.measure, trials.case.limit, 1, cap).run().recommended


def lightning_power(trials: Trials, cap: int, init: int = 2) -> int:
    b, good = init, 0
    for _ in range(25):
        if not trials.fits(b):
            break
        good = b
        if b >= cap:
            break
        b = min(b * 2, cap)
    return good


def lightning_binsearch(trials: Trials, cap: int, init: int = 2) -> int:
    low, high, b = 0, None, init
    for _ in range(25):
        if trials.fits(b):
            low = b
            if high is None:
                if b >= cap:
                    break
                b = min(b * 2, cap)
            elif high - low <= 1:
                break
            else:
                b = (low + high) // 2
        else:
            high = b
            if high - low <= 1:
                break
            b = (low + high) // 2
    return low


def accelerate(trials: Trials, cap: int) -> int:
    b = cap
    while b > 0:
        if trials.fits(b):
            return b
        b = int(b * 0.9)
    return 0


STRATEGIES: dict[str, Callable[[Trials, int], int]] = {
    "torchmem (fit + verify)": torchmem_search,
    "Lightning power": lightning_power,
    "Lightning binsearch": lightning_binsearch,
    "Accelerate (0.9x on OOM)": accelerate,
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 seeds instead of 20")
    p.add_argument("--cap", type=int, default=4096, help="largest size allowed (4096)")
    args = p.parse_args()
    seeds = range(3 if args.quick else 20)
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    print(f"machine: {machine}, Python {platform.python_version()}")
    print(
        f"{len(seeds)} seeds per case; medians, and the worst trial count and lowest 'found' "
        "('found' is the recommendation / true maximum)"
    )
    header = (
        f"{'case':<28} {'strategy':<26} {'trials':>6} {'worst':>5} {'OOMs':>5} {'found':>6} "
        f"{'lowest':>6}"
    )
    print(header)
    print("-" * len(header))
    totals: dict[str, list[tuple[float, float, float]]] = {}
    for case in CASES:
        truth = case.true_max(args.cap)
        for name, strategy in STRATEGIES.items():
            rows = []
            for seed in seeds:
                trials = Trials(case, seed)
                found = strategy(trials, args.cap)
                rows.append((len(trials.sizes), trials.ooms, found / truth))
            t, o, f = (statistics.median(r[i] for r in rows) for i in range(3))
            worst, lowest = max(r[0] for r in rows), min(r[2] for r in rows)
            print(
                f"{case.name:<28} {name:<26} {t:>6.0f} {worst:>5} {o:>5.0f} {f:>6.2f} "
                f"{lowest:>6.2f}"
            )
            totals.setdefault(name, []).append((t, o, lowest))
    how = f"median over {len(CASES)} simulated memory curves x {len(seeds)} seeds"
    for name, found in totals.items():
        trials = statistics.median(r[0] for r in found)
        ooms = statistics.median(r[1] for r in found)
        lowest = min(r[2] for r in found)
        report.row(
            f"tuning, {name}: trials / OOMs / worst found",
            f"{trials:.0f} / {ooms:.0f} / {lowest:.2f}", "", None, how,
        )  # fmt: skip


if __name__ == "__main__":
    main()
