"""Cost of monitoring for the training loop: step time with torchmem vs without.

Runs one CPU training loop in this process in alternating blocks: unmonitored, with the
step hooks and the sampler at 10 Hz (the default), and at 100 Hz (the maximum). Blocks are
interleaved so that drift of the machine hits every variant alike; the table reports the
median step time of each variant and its ratio to the unmonitored loop.

    .venv/bin/python benchmarks/sampler_overhead.py [--blocks 8] [--steps 60]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch
from torch import nn

from torchmem.backends import discover_backends
from torchmem.sampler import Sampler
from torchmem.session import Session
from torchmem.steps import StepTracker


def make_loop(batch: int = 64):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, 10),
    )
    opt = torch.optim.Adam(model.parameters())
    x = torch.randn(batch, 3, 32, 32)
    y = torch.randint(0, 10, (batch,))

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def timed_block(step, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    return times


def run_variant(step, steps: int, hz: float | None) -> list[float]:
    if hz is None:
        return timed_block(step, steps)
    session = Session()
    tracker = StepTracker(session.submit, session.now)
    sampler = Sampler(discover_backends(), session.submit, hz, clock=session.now)
    tracker.install()
    sampler.start()
    try:
        return timed_block(step, steps)
    finally:
        sampler.stop()
        tracker.uninstall()
        assert session.samples > 0 and session.steps.steps == steps, "monitoring saw nothing"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()
    step = make_loop()
    for _ in range(10):  # warm-up: allocator, kernels, Adam state
        step()
    variants = {"unmonitored": None, "torchmem 10 Hz": 10.0, "torchmem 100 Hz": 100.0}
    results: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.blocks):
        for name, hz in variants.items():
            results[name] += run_variant(step, args.steps, hz)
    base = statistics.median(results["unmonitored"])
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(
        f"{'variant':<18} {'median step':>12} {'ratio':>7}   ({args.blocks} blocks x "
        f"{args.steps} steps, interleaved)"
    )
    for name, times in results.items():
        med = statistics.median(times)
        print(f"{name:<18} {med * 1000:>9.2f} ms {med / base:>7.3f}")
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
