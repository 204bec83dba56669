"""``torchmem tune``: the largest batch size that fits, from a few trials, verified.

Each trial is the script at one batch size in a fresh ``torchmem run --max-steps``
process (:mod:`torchmem.tuning.trial`); the search (:mod:`torchmem.tuning.search`)
fits the memory model and verifies its prediction. The terminal shows each trial as it
ends, then the recommendation, the model and the throughput knee; ``--summary`` writes
all of it as JSON.
"""

from __future__ import annotations

import shlex
import shutil
import sys
import threading
import time
from dataclasses import replace

from torchmem.probe.runner import ScriptError, validate_script
from torchmem.record.library import sessions_dir
from torchmem.report.summary import write_summary
from torchmem.tuning.budget import budget_bytes, headroom_bytes
from torchmem.tuning.function import function_plan, function_spec, plan_function
from torchmem.tuning.model import Fit
from torchmem.tuning.predict import can_predict
from torchmem.tuning.predict import predict as predict_memory
from torchmem.tuning.search import Trial, TuneCancelled, TuneError, TuneResult
from torchmem.tuning.summary import tune_summary
from torchmem.tuning.trial import TrialPlan, plan_search
from torchmem.units import format_bytes

#: Exit codes: a recommendation (0), none possible (1), bad options or script (2),
#: interrupted (130).
EXIT_NO_FIT = 1
EXIT_USAGE = 2


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
    max_trials: int = 12,
    summary_path: str | None = None,
    cwd: str | None = None,
    quiet: bool = False,
    record_trials: bool = False,
    job: bool = False,
    predict: bool = True,
) -> int:
    """Run the search from the command line; the exit code says whether a size fits.
    With ``record_trials``, each trial is a recorded session of the sessions folder.
    With ``job``, ``script`` and ``args`` are a command (``torchrun ... train.py``):
    each trial runs it, and the per-rank batch must fit every rank. With ``predict`` (a
    script or a step function), fake steps predict the memory model before any trial."""
    say = (lambda text: None) if quiet else (lambda text: sys.stderr.write(text + "\n"))
    try:
        function = None if job else function_spec(script)
        if job:
            if shutil.which(script) is None:
                raise ValueError(f"no such command: {script} (not a file, nor on PATH)")
            path = script
        elif function is None:
            path = str(validate_script(script))
        if not batch_arg.startswith("-"):
            batch_arg = "--" + batch_arg
        total = budget_bytes(budget, device)
        room = headroom_bytes(headroom, total, device)
    except (ScriptError, TuneError, ValueError) as exc:
        sys.stderr.write(f"torchmem: {exc}\n")
        return EXIT_USAGE
    if function is not None:
        plan = function_plan(*function, steps, device, total, cwd)
        batch_arg = plan.batch_arg
    else:
        plan = TrialPlan(path, tuple(args), batch_arg, steps, device, total, cwd, job=job)
    plan = replace(plan, record_dir=str(sessions_dir()) if record_trials else None)
    limit = total - room
    what = " ".join([script, *args]) if job else script
    say(
        f"torchmem: tuning {what if function else f'{batch_arg} of {what}'} in "
        f"{minimum}..{maximum} on {device}: "
        f"budget {format_bytes(total)}, headroom {format_bytes(room)}, "
        f"so at most {format_bytes(limit)} per trial ({steps} measured steps each)"
        + (
            ("; every rank on this machine together" if device == "cpu" else "; per rank")
            if job
            else ""
        )
    )
    cancel = threading.Event()
    started = time.monotonic()
    prediction = None
    if predict and can_predict(plan):
        say("torchmem: predicting: one step per size under FakeTensorMode, nothing allocated")
        try:
            prediction = predict_memory(plan, minimum, maximum, limit, cancel)
        except KeyboardInterrupt:
            sys.stderr.write("torchmem: tuning interrupted; no trial is left running\n")
            return 130
        say(f"torchmem: {prediction.describe()}")

    def on_trial(trial: Trial, fit: Fit | None) -> None:
        say(
            f"torchmem: trial {len(search.trials)}: {trial.describe(limit)}".replace(
                "\n  ", "\ntorchmem:   "
            )
        )

    search = plan_search(
        plan,
        limit,
        minimum,
        maximum,
        rounding,  # type: ignore[arg-type]
        max_trials,
        on_trial,
        cancel,
        prediction=prediction,
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
            plan, args, limit, room, None, search.trials, time.monotonic() - started, prediction
        )
        data["error"] = str(exc)
        if summary_path:
            write_summary(summary_path, data)
        return EXIT_NO_FIT
    say(_report(result, plan))
    data = tune_summary(
        plan, args, limit, room, result, result.trials, time.monotonic() - started, prediction
    )
    if summary_path and not write_summary(summary_path, data):
        return EXIT_NO_FIT
    return 0


def _report(result: TuneResult, plan: TrialPlan) -> str:
    function = plan_function(plan)
    lines = [
        f"torchmem: {line}" for line in result.explain("batch size" if function else plan.batch_arg)
    ]
    if result.recommended is None:
        pass  # the batch does not move memory: there is no size to put in a command
    elif function:
        lines.append(f"torchmem: call it: {function.partition(':')[2]}({result.recommended})")
    else:
        lines.append(f"torchmem: run it: {shlex.join(plan.command_line(result.recommended))}")
    return "\n".join(lines)
