"""``torchmem tune``: the largest batch size that fits, from a few trials, verified.

Each trial is the script at one batch size in a fresh ``torchmem run --max-steps``
process (:mod:`torchmem.tuning.trial`); the search (:mod:`torchmem.tuning.search`)
fits the memory model and verifies its prediction. The terminal shows each trial as it
ends, then the recommendation, the model and the throughput knee; ``--summary`` writes
all of it as JSON.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace
from typing import Any

import psutil

from torchmem.cli.summary import build_summary, write_summary
from torchmem.probe.runner import ScriptError, validate_script
from torchmem.record.library import sessions_dir
from torchmem.tuning.model import Fit
from torchmem.tuning.search import BatchSearch, Trial, TuneCancelled, TuneError, TuneResult
from torchmem.tuning.trial import TrialPlan, run_trial, substitute
from torchmem.units import format_bytes, parse_bytes

#: Exit codes: a recommendation (0), none possible (1), bad options or script (2),
#: interrupted (130).
EXIT_NO_FIT = 1
EXIT_USAGE = 2


def default_budget(device: str) -> int:
    """Half of the RAM available now (CPU), or the device's free memory (NVML, so that
    asking creates no CUDA context here). TuneError when it cannot be known."""
    if device == "cpu":
        return psutil.virtual_memory().available // 2
    kind, _, index = device.partition(":")
    if kind == "cuda":
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(int(index or 0))
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).free)
        except Exception as exc:
            raise TuneError(
                f"cannot read the free memory of {device} ({exc}): give --budget"
            ) from None
    raise TuneError(f"no default budget for {device}: give --budget")


def headroom_bytes(text: str | None, budget: int, device: str) -> int:
    """``10%`` of the budget, a size (``1GiB``), or the default: 10% on CPU,
    max(10%, 1 GiB) on accelerators (their allocator fragments)."""
    if text is None:
        share = budget // 10
        return share if device == "cpu" else max(share, 1 << 30)
    text = text.strip()
    if text.endswith("%"):
        try:
            value = float(text[:-1])
        except ValueError:
            raise TuneError(f"not a percentage: {text!r}") from None
        if not 0 <= value < 100:
            raise TuneError(f"the headroom must be 0-99%, not {text}")
        return int(budget * value / 100)
    return parse_bytes(text)


def tune_headless(
    script: str,
    args: list[str],
    batch_arg: str = "--batch-size",
    minimum: int = 1,
    maximum: int = 4096,
    budget: str | None = None,
    headroom: str | None = None,
    device: str = "cpu",
    steps: int = 3,
    rounding: str = "none",
    max_trials: int = 10,
    summary_path: str | None = None,
    cwd: str | None = None,
    quiet: bool = False,
    record_trials: bool = False,
) -> int:
    """Run the search from the command line; the exit code says whether a size fits.
    With ``record_trials``, each trial is a recorded session of the sessions folder."""
    say = (lambda text: None) if quiet else (lambda text: sys.stderr.write(text + "\n"))
    try:
        path = str(validate_script(script))
        if not batch_arg.startswith("-"):
            batch_arg = "--" + batch_arg
        budget_bytes = parse_bytes(budget) if budget else default_budget(device)
        room = headroom_bytes(headroom, budget_bytes, device)
        if room >= budget_bytes:
            raise TuneError(
                f"the headroom ({format_bytes(room)}) leaves nothing of the budget "
                f"({format_bytes(budget_bytes)})"
            )
    except (ScriptError, TuneError, ValueError) as exc:
        sys.stderr.write(f"torchmem: {exc}\n")
        return EXIT_USAGE
    record_dir = str(sessions_dir()) if record_trials else None
    plan = TrialPlan(path, tuple(args), batch_arg, steps, device, budget_bytes, cwd)
    plan = replace(plan, record_dir=record_dir)
    limit = budget_bytes - room
    say(
        f"torchmem: tuning {batch_arg} of {script} in {minimum}..{maximum} on {device}: "
        f"budget {format_bytes(budget_bytes)}, headroom {format_bytes(room)}, "
        f"so at most {format_bytes(limit)} per trial ({steps} measured steps each)"
    )
    cancel = threading.Event()
    started = time.monotonic()

    def measure(batch: int, role: str, predicted: float | None) -> Trial:
        return run_trial(plan, batch, cancel)

    def on_trial(trial: Trial, fit: Fit | None) -> None:
        say(_trial_line(len(search.trials), trial, limit))

    search = BatchSearch(
        measure,
        limit,
        minimum,
        maximum,
        rounding,
        max_trials,
        on_trial,
        cancel,  # type: ignore[arg-type]
    )
    try:
        result = search.run()
    except KeyboardInterrupt:
        cancel.set()
        sys.stderr.write("torchmem: tuning interrupted; no trial is left running\n")
        return 130
    except TuneCancelled:
        return 130
    except TuneError as exc:
        sys.stderr.write(f"torchmem: {exc}\n")
        data = tune_summary(
            plan, args, limit, room, None, search.trials, time.monotonic() - started
        )
        data["error"] = str(exc)
        if summary_path:
            write_summary(summary_path, data)
        return EXIT_NO_FIT
    say(_report(result, plan))
    data = tune_summary(plan, args, limit, room, result, result.trials, time.monotonic() - started)
    if summary_path and not write_summary(summary_path, data):
        return EXIT_NO_FIT
    return 0


def _trial_line(n: int, trial: Trial, limit: float) -> str:
    peak = format_bytes(trial.peak_bytes) if trial.peak_bytes is not None else "-"
    if trial.oom:
        verdict = "OUT OF MEMORY"
    elif not trial.ok:
        verdict = "failed"
    else:
        verdict = "fits" if trial.fits(limit) else "over the limit"
    rate = f", {trial.samples_per_s:,.0f} samples/s" if trial.samples_per_s else ""
    predicted = (
        f" (predicted {format_bytes(trial.predicted_bytes)})" if trial.predicted_bytes else ""
    )
    line = (
        f"torchmem: trial {n}: batch {trial.batch_size} ({trial.role}): peak {peak}"
        f"{predicted}, {verdict}{rate} [{trial.duration_s:.1f} s]"
    )
    return line + (f"\ntorchmem:   {trial.message}" if trial.message else "")


def _report(result: TuneResult, plan: TrialPlan) -> str:
    lines = [
        f"torchmem: recommended {plan.batch_arg} {result.recommended} "
        f"({len(result.trials)} trials, {result.ooms} out of memory); largest measured to "
        f"fit: {result.max_fitting}"
        + (f", model's prediction: {result.predicted}" if result.predicted else "")
    ]
    if result.fit is not None:
        lines.append(f"torchmem: memory model: {result.fit.describe()}")
    if result.knee is not None:
        lines.append(
            f"torchmem: throughput knee: {result.knee} (within 5% of the best samples/s "
            "measured; larger sizes buy memory use, not speed)"
        )
    lines += [f"torchmem: note: {note}" for note in result.notes]
    command = " ".join([plan.script, *substitute(plan.args, plan.batch_arg, result.recommended)])
    lines.append(f"torchmem: run it: python {command}")
    return "\n".join(lines)


def tune_summary(
    plan: TrialPlan,
    args: list[str],
    limit: int,
    room: int,
    result: TuneResult | None,
    trials: list[Trial],
    duration: float,
) -> dict[str, Any]:
    """The search as ``--summary`` (and the Tune panel's export) writes it."""
    fitting = [t.peak_bytes for t in trials if t.fits(limit) and t.peak_bytes is not None]
    metric = "cpu_rss" if plan.on_cpu else plan.device
    return build_summary(
        "tune",
        None,
        steps=sum(t.steps for t in trials),
        samples=0,
        peak_bytes={metric: max(fitting)} if fitting else {},
        alerts=[],
        script=plan.script,
        argv=list(args),
        batch_arg=plan.batch_arg,
        device=plan.device,
        budget_bytes=plan.budget_bytes,
        headroom_bytes=room,
        limit_bytes=limit,
        steps_per_trial=plan.steps,
        recommended=result.recommended if result else None,
        max_fitting=result.max_fitting if result else None,
        predicted=result.predicted if result else None,
        knee=result.knee if result else None,
        fit=result.fit.to_json() if result and result.fit else None,
        ooms=sum(t.oom for t in trials),
        trials=[t.to_json() for t in trials],
        notes=result.notes if result else [],
        duration_s=round(duration, 3),
    )
