"""Cost of monitoring for the training loop: step time with torchmem vs without.

Runs one CPU training loop in this process in alternating blocks: unmonitored, with
torchmem at its defaults (step hooks, sampler at 10 Hz, a reading at every step boundary,
leak detection, automatic censuses within their 1 % budget), and with the sampler at
100 Hz. Blocks are interleaved so that drift of the machine hits every variant alike; the
table reports the median and the mean step time of each variant and their ratios to the
unmonitored loop (the mean includes the rare steps that took a census).

    .venv/bin/python benchmarks/sampler_overhead.py [--blocks 8] [--steps 60]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import report
import torch
from cnn_loop import make_loop

from torchmem.probe.backends import discover_backends
from torchmem.probe.sampler import Sampler
from torchmem.probe.steps import StepTracker
from torchmem.session import Session
from torchmem.sources.inprocess import InProcessSource


def timed_block(step, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return times


class Monitored:
    """torchmem as `torchmem run` sets it up: step hooks, sampler, boundary readings, leak
    detection and automatic censuses, all at their defaults (one session for all blocks)."""

    def __init__(self, hz: float) -> None:
        self.session = Session()
        self.source = InProcessSource(self.session, hz=hz)
        self.tracker = StepTracker(self.source.emit, self.session.now)

    def block(self, step, steps: int) -> list[float]:
        self.tracker.install()
        self.source.sampler.start()
        try:
            return self.timed(step, steps)
        finally:
            self.source.sampler.stop()
            self.source.sampler.flush_boundaries()
            self.tracker.uninstall()

    def timed(self, step, steps: int) -> list[float]:
        """The timed steps, while torchmem runs (subclasses measure more around them)."""
        return timed_block(step, steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch intra-op threads (0: torch's default, one per core)",
    )
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    step = make_loop()
    for _ in range(10):  # warm-up: allocator, kernels, Adam state
        step()
    variants = {
        "unmonitored": None,
        "torchmem defaults": Monitored(10.0),
        "torchmem 100 Hz": Monitored(100.0),
    }
    results: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.blocks):
        for name, monitor in variants.items():
            results[name] += (
                timed_block(step, args.steps)
                if monitor is None
                else monitor.block(step, args.steps)
            )
    base = statistics.median(results["unmonitored"])
    base_mean = statistics.fmean(results["unmonitored"])
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(
        f"{'variant':<18} {'median step':>12} {'ratio':>7} {'mean step':>11} {'ratio':>7}"
        f"   ({args.blocks} blocks x {args.steps} steps, interleaved)"
    )
    for name, times in results.items():
        med, mean = statistics.median(times), statistics.fmean(times)
        print(
            f"{name:<18} {med * 1000:>9.2f} ms {med / base:>7.3f} {mean * 1000:>8.2f} ms "
            f"{mean / base_mean:>7.3f}"
        )
    how = f"median step, {args.blocks} interleaved blocks x {args.steps} steps, CPU CNN"
    for name, limit in (("torchmem defaults", 1.02), ("torchmem 100 Hz", None)):
        ratio = statistics.median(results[name]) / base
        if limit is None:
            report.row(f"step time, {name}", f"{ratio:.3f}x", "", None, how)
        else:
            report.ratio_row(f"step time, {name} (10 Hz, leak tracking)", ratio, limit, how)
    for name, monitor in variants.items():
        if monitor is not None:
            session = monitor.session
            print(
                f"{name}: {session.samples} samples, {session.steps.steps} steps, "
                f"{len(session.census_history)} censuses, {len(session.alerts)} alerts"
            )
    sampler = Sampler(discover_backends(), lambda s: None)
    started = time.perf_counter()
    for _ in range(500):
        sampler.read()
    per_read = (time.perf_counter() - started) / 500
    print(
        f"one sampler read (all backends): {per_read * 1e6:.0f} us, i.e. "
        f"{per_read * 10 * 100:.3f}% of one core at 10 Hz"
    )


if __name__ == "__main__":
    main()
