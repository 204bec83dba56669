"""Cost of monitoring for the training loop: step time with torchmem vs without.

Runs one CPU training loop in this process in alternating blocks: unmonitored, with
the sampler alone at 10 Hz (a thread polling memory; no step hooks), with torchmem at its
defaults (step hooks, sampler at 10 Hz, a reading at every step boundary,
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


class SamplerOnly:
    """The sampler thread alone, polling every backend at 10 Hz into a Session: what a
    live trace costs a loop that torchmem does not otherwise touch."""

    def __init__(self, hz: float) -> None:
        self.session = Session()
        self.sampler = Sampler(discover_backends(), self.session.submit, hz)

    def block(self, step, steps: int) -> list[float]:
        self.sampler.start()
        try:
            return timed_block(step, steps)
        finally:
            self.sampler.stop()


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
        "sampler alone 10 Hz": SamplerOnly(10.0),
        "torchmem defaults": Monitored(10.0),
        "torchmem 100 Hz": Monitored(100.0),
    }
    results: dict[str, list[float]] = {name: [] for name in variants}
    # Each round runs every variant once, in an order rotated round by round; a variant's
    # ratio in a round is its median step over the unmonitored one's of the same round, so
    # that the machine's drift (a 2-core VM's neighbours) cancels in pairs.
    rounds: list[dict[str, float]] = []
    names = list(variants)
    for r in range(args.blocks):
        medians = {}
        for name in names[r % len(names) :] + names[: r % len(names)]:
            monitor = variants[name]
            times = (
                timed_block(step, args.steps)
                if monitor is None
                else monitor.block(step, args.steps)
            )
            results[name] += times
            medians[name] = statistics.median(times)
        rounds.append(medians)
    base_mean = statistics.fmean(results["unmonitored"])

    def paired(name: str) -> list[float]:
        return sorted(m[name] / m["unmonitored"] for m in rounds)

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(
        f"{'variant':<20} {'median step':>12} {'mean step':>11} {'ratio':>7}"
        f"   {'paired ratio: median [quartiles]':>34}"
        f"   ({args.blocks} rounds x {args.steps} steps, order rotated)"
    )
    for name, times in results.items():
        med, mean = statistics.median(times), statistics.fmean(times)
        ratios = paired(name)
        q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        print(
            f"{name:<20} {med * 1000:>9.2f} ms {mean * 1000:>8.2f} ms {mean / base_mean:>7.3f}"
            f"   {statistics.median(ratios):>17.3f} [{q1:.3f}, {q3:.3f}]"
        )
    print("(ratio: mean step over the unmonitored mean, censuses included)")
    how = (
        f"paired median of {args.blocks} rotated rounds x {args.steps} steps, CPU CNN, "
        f"{torch.get_num_threads()} torch threads"
    )
    for name, figure, limit in (
        ("sampler alone 10 Hz", "step time, the sampler alone (10 Hz)", 1.01),
        ("torchmem defaults", "step time, torchmem defaults (10 Hz, leak tracking)", 1.02),
        ("torchmem 100 Hz", "step time, torchmem 100 Hz", None),
    ):
        ratio = statistics.median(paired(name))
        if limit is None:
            report.row(figure, f"{ratio:.3f}x", "", None, how)
        else:
            report.ratio_row(figure, ratio, limit, how)
    for name, monitor in variants.items():
        if isinstance(monitor, Monitored):
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
