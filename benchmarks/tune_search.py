"""Batch-size search: torchmem's against the peers' strategies, on models of known memory.

Each strategy searches the same synthetic training runs, whose peak memory is
``fixed + per_sample*b (+ quad*b²)`` with 1% noise and whose trials run out of memory
above the budget, so the true largest size is known exactly. Rows: trials, out-of-memory
trials, and the recommendation as a share of the true maximum (1.00 is perfect; above
1.00 would OOM later). The peers run twice: as faithful reference implementations, written from
their code and documentation, and, where they are installed (``pip install lightning
accelerate``), as their own code, each trial failing with the CPU allocator's
out-of-memory error that both recognise:

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
from collections.abc import Callable
from dataclasses import dataclass

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


def torchmem_predicted(trials: Trials, cap: int) -> int:
    """The search started from a fake step's model (``torchmem tune``'s default for a
    script): the fake step sees tensors only, here 1.3x short of what the real run pays
    per sample (RSS over tensor bytes, as measured on CPU for an LSTM), and none of its
    fixed part."""
    from torchmem.tuning.model import Fit

    case = trials.case
    prior = Fit(intercept=0.0, slope=case.per_sample / 1.3, quadratic=case.quad / 1.3)
    return BatchSearch(trials.measure, case.limit, 1, cap, prior=prior).run().recommended


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


#: What PyTorch's CPU allocator raises when an allocation fails: the message every peer's
#: out-of-memory check recognises on CPU (Lightning's ``is_oom_error``, Accelerate's
#: ``should_reduce_batch_size``).
CPU_OOM = "DefaultCPUAllocator: can't allocate memory: you tried to allocate {} bytes."


def _raise_unless_fits(trials: Trials, b: int) -> None:
    if not trials.fits(b):
        raise RuntimeError(CPU_OOM.format(int(trials.case.peak(b))))


def real_accelerate(trials: Trials, cap: int) -> int:
    """Accelerate's own ``find_executable_batch_size``, its trials failing as a CPU
    allocator would."""
    from accelerate.utils import find_executable_batch_size

    @find_executable_batch_size(starting_batch_size=cap)
    def run(batch_size: int) -> int:
        _raise_unless_fits(trials, batch_size)
        return batch_size

    try:
        return run()
    except RuntimeError:  # "No executable batch size found, reached zero."
        return 0


def real_lightning(mode: str) -> Callable[[Trials, int], int]:
    """Lightning's own ``Tuner.scale_batch_size`` in ``mode``: a Trainer fits a module
    for 3 steps per trial (Lightning's default), each step failing as a CPU allocator
    would when the simulated run's peak is over the budget."""

    def search(trials: Trials, cap: int) -> int:
        import logging
        import warnings

        import lightning.pytorch as pl
        import torch
        from lightning.pytorch.tuner import Tuner

        logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", module="lightning")

        class Module(pl.LightningModule):
            def __init__(self) -> None:
                super().__init__()
                self.batch_size = 2
                self.layer = torch.nn.Linear(1, 1)

            def train_dataloader(self) -> torch.utils.data.DataLoader:
                # One row per sample: Lightning re-creates it at each new size.
                return torch.utils.data.DataLoader(
                    torch.utils.data.TensorDataset(torch.zeros(max(self.batch_size, 1) * 4, 1)),
                    batch_size=self.batch_size,
                )

            def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
                if index == 0:  # a trial's first step: one trial of this size
                    _raise_unless_fits(trials, self.batch_size)
                return self.layer(batch[0]).sum()

            def configure_optimizers(self) -> torch.optim.Optimizer:
                return torch.optim.SGD(self.parameters(), lr=0.0)

        trainer = pl.Trainer(
            accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        # Lightning's defaults but the first size (2, as the references): with max_val at
        # the range's top, 2.6 stops on reaching it and returns that size untried.
        found = Tuner(trainer).scale_batch_size(Module(), mode=mode, init_val=2)
        return int(found or 0)

    return search


STRATEGIES: dict[str, Callable[[Trials, int], int]] = {
    "torchmem (fit + verify)": torchmem_search,
    "torchmem, fake-step prior": torchmem_predicted,
    "Lightning power": lightning_power,
    "Lightning binsearch": lightning_binsearch,
    "Accelerate (0.9x on OOM)": accelerate,
}


def real_peers(which: str = "all") -> dict[str, Callable[[Trials, int], int]]:
    """The peers' own finders where they are installed (``pip install lightning
    accelerate``): the same simulated runs, fed to their code. ``which``: "all",
    "accelerate" (Lightning's import and Trainers take most of a quick run) or "none"."""
    import importlib.util

    found: dict[str, Callable[[Trials, int], int]] = {}
    if which == "none":
        return found
    if which == "all" and importlib.util.find_spec("lightning") is not None:
        import lightning

        found[f"Lightning {lightning.__version__} power (real)"] = real_lightning("power")
        found[f"Lightning {lightning.__version__} binsearch (real)"] = real_lightning("binsearch")
    if importlib.util.find_spec("accelerate") is not None:
        import accelerate

        found[f"Accelerate {accelerate.__version__} (real)"] = real_accelerate
    return found


class HeapRuns:
    """A CPU script's peak RSS as glibc gives it: ``fixed + per_sample*b`` plus 0 to 3
    whole heap chunks kept resident or not, at random in each run (an MLP with Adam on
    CPU moved 665-713 MiB over five identical runs at batch 1). Nothing crashes: a trial
    over the limit is one the runner stops at the budget."""

    def __init__(self, fixed: float, per_sample: float, chunk: float, seed: int) -> None:
        self.fixed, self.per_sample, self.chunk = fixed, per_sample, chunk
        self.rng = random.Random(seed)

    def run(self, b: int) -> int:
        """One plain run's peak at batch ``b``."""
        return int(self.fixed + self.per_sample * b + self.chunk * self.rng.randrange(4))

    def __call__(self, b: int, role: str, predicted: float | None) -> Trial:
        return Trial(b, self.run(b), ok=True, oom=False)


#: (name, fixed, per sample, room under the limit, heap chunk): the noise of identical
#: runs (three chunks) is 10 to 16% of the room.
NOISY_CASES = (
    ("1 MiB/sample, 240 MiB room, 8 MiB chunks", 300 * MiB, MiB, 240 * MiB, 8 * MiB),
    ("1 MiB/sample, 300 MiB room, 16 MiB chunks", 600 * MiB, MiB, 300 * MiB, 16 * MiB),
    ("MLP+Adam, 300 KiB/sample, 16 MiB chunks", 665 * MiB, 300 << 10, 600 * MiB, 16 * MiB),
)


def noisy(seeds: range) -> None:
    """torchmem's search where identical runs differ: trials over the limit, the spread
    of its answers, and whether five plain runs of each answer stay under the budget."""
    print("\nRSS noise (torchmem only; the limit is the budget less 10% headroom)")
    header = (
        f"{'case':<44} {'trials':>6} {'worst':>5} {'over':>5} {'worst':>5} {'answers':>11} "
        f"{'fit 5/5':>7}"
    )
    print(header)
    print("-" * len(header))
    for name, fixed, per_sample, room, chunk in NOISY_CASES:
        limit = fixed + room
        counts, over, answers, fitting = [], [], [], 0
        for seed in seeds:
            script = HeapRuns(fixed, per_sample, chunk, seed)
            result = BatchSearch(script, limit, 1, 4096).run()
            counts.append(len(result.trials))
            over.append(sum(not t.fits(limit) for t in result.trials))
            answers.append(result.recommended)
            fitting += max(script.run(result.recommended) for _ in range(5)) <= limit / 0.9
        span = f"{min(answers)}-{max(answers)}"
        print(
            f"{name:<44} {statistics.median(counts):>6.0f} {max(counts):>5} "
            f"{statistics.mean(over):>5.2f} {max(over):>5} {span:>11} "
            f"{fitting:>3}/{len(seeds):<3}"
        )
        report.row(
            f"tuning under RSS noise, {name}: trials / mean over-limit / answers",
            f"{statistics.median(counts):.0f} / {statistics.mean(over):.2f} / {span}",
            "every answer fits 5 plain runs", fitting == len(seeds),
            f"{len(seeds)} seeds",
        )  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 seeds instead of 20")
    p.add_argument("--cap", type=int, default=4096, help="largest size allowed (4096)")
    p.add_argument("--seeds", type=int, help="seeds per case (20; 3 with --quick)")
    p.add_argument("--cases", type=int, default=len(CASES), help="the first N cases (all)")
    p.add_argument(
        "--real", choices=("all", "accelerate", "none"), default="all",
        help="which peers also run as their own code, where installed (all)",
    )  # fmt: skip
    args = p.parse_args()
    seeds = range(args.seeds or (3 if args.quick else 20))
    cases = CASES[: max(1, args.cases)]
    machine = f"{platform.machine()}, {os.cpu_count()} cores"
    print(f"machine: {machine}, Python {platform.python_version()}")
    print(
        f"{len(seeds)} seeds per case; medians, and the worst trial count and lowest 'found' "
        "('found' is the recommendation / true maximum)"
    )
    header = (
        f"{'case':<28} {'strategy':<34} {'trials':>6} {'worst':>5} {'OOMs':>5} {'found':>6} "
        f"{'lowest':>6}"
    )
    print(header)
    print("-" * len(header))
    totals: dict[str, list[tuple[float, float, float]]] = {}
    peers = real_peers(args.real)
    if not peers and args.real == "all":
        print("(the peers' own finders are not installed: pip install lightning accelerate)")
    for case in cases:
        truth = case.true_max(args.cap)
        for name, strategy in {**STRATEGIES, **peers}.items():
            rows = []
            # A real Trainer takes a second per trial: fewer seeds (the noise is 1%).
            for seed in seeds if name not in peers else seeds[: 1 if args.quick else 3]:
                trials = Trials(case, seed)
                found = strategy(trials, args.cap)
                rows.append((len(trials.sizes), trials.ooms, found / truth))
            t, o, f = (statistics.median(r[i] for r in rows) for i in range(3))
            worst, lowest = max(r[0] for r in rows), min(r[2] for r in rows)
            print(
                f"{case.name:<28} {name:<34} {t:>6.0f} {worst:>5} {o:>5.0f} {f:>6.2f} "
                f"{lowest:>6.2f}"
            )
            totals.setdefault(name, []).append((t, o, lowest))
    noisy(range(max(len(seeds), 10)))
    how = f"median over {len(cases)} simulated memory curves x {len(seeds)} seeds"
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
