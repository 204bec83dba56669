"""Predict before running: the memory model from fake steps, anchored on one real trial.

One step of the script under FakeTensorMode (:mod:`torchmem.tuning.fake_step`, in a
child process) gives its peak tensor bytes at any batch size in a fraction of a second
and with nothing allocated, so the part of the memory that grows with the batch is known
before any real trial. What it cannot see (the interpreter and libraries in RSS, the
allocator's cache on a device) does not depend on the batch: the first real trial
supplies it. The search then goes straight to the predicted size and verifies it, two
real trials where probing takes five or six.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torchmem.sources.children import end_tree
from torchmem.tuning.model import Fit, fit_exact, fit_peaks
from torchmem.tuning.search import TuneCancelled
from torchmem.tuning.trial import TrialPlan, start_child

#: The fake steps must not hold up a search that would work without them.
TIMEOUT_S = 120.0


@dataclass
class Prediction:
    """The fake steps' outcome: peak tensor bytes per batch size and their model, or why
    there is none."""

    points: list[tuple[int, int]] = field(default_factory=list)
    fit: Fit | None = None
    seconds: float = 0.0
    error: str | None = None
    #: Stand-in values the fake step gave to tensor values read before backward.
    caveats: list[str] = field(default_factory=list)
    #: The fake steps ran whole at two sizes or more and their tensors did not grow with
    #: the batch: the script seems not to read the option (see :func:`~torchmem.tuning.
    #: search.resolution`).
    flat: bool = False

    def describe(self) -> str:
        """One line: what was predicted, or why not."""
        if self.fit is None:
            return f"no prediction before running: {self.error or 'too few sizes'}"
        from torchmem.units import format_bytes

        sizes = ", ".join(str(b) for b, _ in self.points)
        shape = f"{format_bytes(self.fit.slope)} × batch"
        if self.fit.is_quadratic:
            shape += f" + {format_bytes(self.fit.quadratic)} × batch²"
        caveats = "".join(f"; {caveat}" for caveat in self.caveats)
        return (
            f"predicted before running: one step under FakeTensorMode at batch sizes {sizes} "
            f"({self.seconds:.1f} s, nothing allocated): tensors grow by {shape}{caveats}"
        )

    def to_json(self) -> dict[str, Any]:
        """As the tuning summary writes it (``prediction``)."""
        return {
            "points": [[b, p] for b, p in self.points],
            "fit": self.fit.to_json() if self.fit is not None else None,
            "seconds": round(self.seconds, 3),
            "error": self.error,
            "caveats": list(self.caveats),
        }


def can_predict(plan: TrialPlan) -> bool:
    """True for a plan whose trials run a Python file (a script, or a step function by
    reference); a job's ranks run under torchrun, which fake tensors cannot."""
    return not plan.job and bool(plan.script) and Path(plan.script).is_file()


def anchored(prior: Fit, batch: int, peak: float) -> Fit:
    """``prior`` (tensor bytes) moved onto a real trial's ``peak`` at ``batch``: the same
    growth, plus what the fake step could not see, which does not grow with the batch."""
    return Fit(
        intercept=peak - prior.slope * batch - prior.quadratic * batch * batch,
        slope=prior.slope,
        quadratic=prior.quadratic,
        points=1,
    )


def scaled(prior: Fit, points: list[tuple[int, float]]) -> Fit:
    """``a + k*(prior's growth)`` through two or three real trials: the fake step's shape,
    its scale set by what the real process pays per tensor byte (RSS over tensor bytes on
    CPU, the allocator's rounding on a device). Anchored on the largest trial when the
    trials do not grow with the prior (noise between two close sizes)."""
    growth = [prior.slope * b + prior.quadratic * b * b for b, _ in points]
    line = fit_peaks(growth, [p for _, p in points], allow_quadratic=False)
    if line.slope <= 0:
        b, p = max(points)
        return anchored(prior, b, p)
    return Fit(
        intercept=line.intercept,
        slope=line.slope * prior.slope,
        quadratic=line.slope * prior.quadratic,
        rms_residual=line.rms_residual,
        points=len(points),
    )


def predict(
    plan: TrialPlan,
    minimum: int,
    maximum: int,
    limit: float,
    cancel: threading.Event | None = None,
) -> Prediction:
    """Run the fake steps of ``plan``'s script in a child process, from ``minimum`` up
    eightfold until the tensors alone pass ``limit`` or ``maximum`` is reached; a
    Prediction without a fit, saying why, when they cannot run (never an exception but
    TuneCancelled)."""
    cancel = cancel or threading.Event()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="torchmem-predict-") as tmp:
        out = Path(tmp) / "points.json"
        errors = Path(tmp) / "stderr"
        command = [
            sys.executable, "-m", "torchmem.tuning.fake_step", "--out", str(out),
            f"--batch-arg={plan.batch_arg}", "--min", str(minimum), "--max", str(maximum),
            "--until", str(int(limit)),
            plan.script, *plan.args,
        ]  # fmt: skip
        with open(errors, "wb") as stderr:
            try:
                proc = start_child(command, plan.cwd, stderr)
            except OSError as exc:
                return Prediction(error=f"cannot start the fake step: {exc}")
            code = _wait(proc, cancel)
        seconds = time.monotonic() - started
        if code is None:
            return Prediction(seconds=seconds, error=f"the fake steps took over {TIMEOUT_S:g} s")
        try:
            data = json.loads(out.read_text())
        except (OSError, ValueError):
            tail = errors.read_text(errors="replace").strip().splitlines()
            why = tail[-1] if tail else f"exit code {code}"
            return Prediction(seconds=seconds, error=f"the fake step process failed: {why}")
    points = [(int(b), int(p)) for b, p in data.get("points", [])]
    prediction = Prediction(points, None, seconds, data.get("error"), list(data.get("caveats", [])))
    if len({b for b, _ in points}) >= 2:
        fit = fit_exact(points)
        if fit.slope > 0 or fit.quadratic > 0:
            prediction.fit = fit
        elif prediction.error is None:
            prediction.error = "the fake step's tensors did not grow with the batch size"
            prediction.flat = True
    elif prediction.error is None:
        prediction.error = "fewer than two batch sizes in the range"
    return prediction


def _wait(proc: subprocess.Popen[bytes], cancel: threading.Event) -> int | None:
    """The child's exit code; None after the timeout; TuneCancelled on cancel (the child
    ended either way)."""
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                return proc.wait(timeout=0.05)
            if cancel.is_set():
                raise TuneCancelled()
            if time.monotonic() > deadline:
                end_tree(proc, grace_s=0)
                return None
    except BaseException:
        end_tree(proc, grace_s=0)  # nothing to do for a child that has ended
        raise
