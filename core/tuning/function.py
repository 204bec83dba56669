"""``torchmem.tune(step_fn)``: the batch-size search for a Python function (notebooks).

The same search and result as ``torchmem tune`` on a script; only the trial differs.
Trials run outside the caller, so that an out-of-memory error costs a trial, never the
notebook's session:

- ``process``: a fresh ``torchmem run`` of :mod:`~torchmem.tuning.step_driver`, which
  imports the function by reference (it must live in an importable module);
- ``fork``: a child forked from the caller, for a function no other process can import
  (defined in a notebook cell). Refused once CUDA is initialised here (a forked child
  cannot use it); on CPU the child runs torch on one thread (OpenMP's threads do not
  survive a fork), so its samples/s are one thread's, and its peak RSS includes the
  caller's own pages, as the caller's would if it trained;
- ``none``: in the caller itself, only when asked: an out-of-memory error is then caught
  here, and on CPU the budget is judged after the fact instead of enforced.

``auto`` takes the first of ``process`` and ``fork`` that can work and says which.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from torchmem.probe.parent_watch import set_pdeathsig
from torchmem.tuning import step_driver
from torchmem.tuning.budget import budget_bytes, headroom_bytes
from torchmem.tuning.calls import accelerator, measure_calls
from torchmem.tuning.model import Fit, Rounding
from torchmem.tuning.search import (
    BatchSearch,
    Trial,
    TuneError,
    TuneResult,
    prior_share,
    resolution,
)
from torchmem.tuning.trial import TrialPlan, measured_trial, run_trial, watch_child
from torchmem.units import format_bytes

Isolation = Literal["auto", "process", "fork", "none"]
#: The script every by-reference trial runs.
DRIVER = str(Path(step_driver.__file__).resolve())
StepFn = Callable[[int], Any]


def reference(fn: StepFn) -> str | None:
    """``module:qualname`` when a fresh process can import ``fn`` by that name, else None
    (a function of ``__main__``, a closure, a lambda, a bound method)."""
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if found is fn else None


def function_spec(spec: str) -> tuple[str, str] | None:
    """``(module:function, folder to import from)`` for ``steps.py:train_step`` or
    ``package.module:train_step``; None when ``spec`` names neither (a script's path).
    TuneError for a ``.py`` file that does not exist."""
    where, sep, qualname = spec.strip().rpartition(":")
    if not sep or not where or not all(part.isidentifier() for part in qualname.split(".")):
        return None
    if where.endswith(".py"):
        file = Path(where).expanduser().resolve()
        if not file.is_file():
            raise TuneError(f"no such file: {where} (of the step function {spec})")
        return f"{file.stem}:{qualname}", str(file.parent)
    if all(part.isidentifier() for part in where.split(".")):
        return f"{where}:{qualname}", os.getcwd()
    return None


def function_plan(
    target: str, import_from: str, steps: int, device: str, budget: int, cwd: str | None = None
) -> TrialPlan:
    """The plan of trials that import ``target`` (``module:function``) in fresh processes
    (:mod:`~torchmem.tuning.step_driver`) and call it with each trial's batch size."""
    return TrialPlan(
        script=DRIVER,
        args=("--target", target, "--sys-path", import_from, "--calls", str(steps + 1)),
        batch_arg="--batch-size", steps=steps, device=device, budget_bytes=budget,
        cwd=cwd or os.getcwd(),
    )  # fmt: skip


def plan_function(plan: TrialPlan) -> str | None:
    """The ``module:function`` a plan's trials call, or None for a script's plan."""
    if plan.script != DRIVER or "--target" not in plan.args:
        return None
    return plan.args[plan.args.index("--target") + 1]


def tune(
    step_fn: StepFn,
    *,
    min_batch: int = 1,
    max_batch: int = 4096,
    budget: int | str | None = None,
    headroom: int | str | None = None,
    device: str = "cpu",
    steps: int = 3,
    rounding: Rounding = "none",
    max_trials: int = 12,
    isolation: Isolation = "auto",
    on_trial: Callable[[Trial, Fit | None], None] | None = None,
    cancel: threading.Event | None = None,
    verbose: bool = True,
    predict: bool = True,
) -> TuneResult:
    """The largest batch size for which ``step_fn(batch_size)`` stays under ``budget``.

    ``step_fn`` makes one full training step (forward, backward, optimizer step) at the
    batch size it is given. ``budget`` is bytes or text (``"6GiB"``); by default half of
    the available RAM on CPU, the device's free memory on CUDA. ``headroom`` is bytes,
    text or a percentage (default 10%; at least 1 GiB on accelerators). ``isolation``
    says where trials run (see the module's text). ``on_trial(trial, fit)`` hears of each
    trial as it ends; setting ``cancel`` ends the running trial and raises TuneCancelled;
    ``verbose`` prints one line per trial. With ``predict``, a function that runs by
    reference is first stepped under FakeTensorMode (see :mod:`torchmem.tuning.predict`:
    three real trials instead of five or six). Raises TuneError when no size fits,
    saying why; the result prints as the recommendation and its reasons.
    """
    if not callable(step_fn):
        raise TuneError(f"step_fn must be a function of the batch size, not {step_fn!r}")
    try:
        accelerator(device)
    except (ValueError, ImportError) as exc:
        raise TuneError(str(exc)) from None
    total = budget_bytes(budget, device)
    room = headroom_bytes(headroom, total, device)
    limit = total - room
    measure, notes, plan = _trials(step_fn, isolation, steps, device, total)
    say = print if verbose else (lambda *_: None)
    name = getattr(step_fn, "__qualname__", repr(step_fn))
    say(
        f"torchmem: tuning {name} in {min_batch}..{max_batch} on {device}: at most "
        f"{format_bytes(limit)} per trial ({format_bytes(total)} budget, "
        f"{format_bytes(room)} headroom)"
    )
    cancel = cancel or threading.Event()
    prior, flat = None, False
    if predict and plan is not None:
        from torchmem.tuning.predict import predict as predict_memory

        prediction = predict_memory(plan, min_batch, max_batch, limit, cancel)
        say(f"torchmem: {prediction.describe()}")
        notes.insert(0, prediction.describe())
        prior, flat = prediction.fit, prediction.flat

    def heard(trial: Trial, fit: Fit | None) -> None:
        say(f"torchmem: trial {len(search.trials)}: {trial.describe(limit)}")
        if on_trial is not None:
            on_trial(trial, fit)

    search = BatchSearch(
        lambda batch, role, predicted: measure(batch, cancel),
        limit,
        min_batch,
        max_batch,
        rounding,
        max_trials,
        heard,
        cancel,
        prior=prior,
        prior_share=prior_share(device),
        resolution=resolution(device, flat),
    )
    try:
        result = search.run()
    except BaseException:
        cancel.set()  # Ctrl+C in a notebook: the running trial is ended, never left behind
        raise
    result.notes += notes
    say("\n".join(f"torchmem: {line}" for line in result.explain()))
    return result


Measure = Callable[[int, threading.Event], Trial]


def _trials(
    fn: StepFn, isolation: Isolation, steps: int, device: str, total: int
) -> tuple[Measure, list[str], TrialPlan | None]:
    """The trial runner, what to tell the user about where trials run, and the plan of
    trials that run the function by reference (None when they run forked or here)."""
    if isolation not in ("auto", "process", "fork", "none"):
        raise TuneError(f"isolation must be auto, process, fork or none, not {isolation!r}")
    target = reference(fn) if isolation in ("auto", "process") else None
    if target is not None:
        plan = function_plan(target, os.pathsep.join(sys.path), steps, device, total)
        return lambda batch, cancel: run_trial(plan, batch, cancel), [], plan
    plan = TrialPlan(script="", args=(), batch_arg="", steps=steps, device=device,
                     budget_bytes=total)  # fmt: skip
    if isolation == "process":
        raise TuneError(
            f"{fn!r} cannot be imported by another process (it is defined in __main__, "
            "in a function, or is a lambda): move it into a module, or use isolation='fork'"
        )
    if isolation == "none":
        note = (
            "trials ran in this process (isolation='none'): an out-of-memory error was "
            "caught here, and on CPU the budget was judged after each trial, not enforced"
        )
        return lambda batch, cancel: _in_process(fn, plan, batch), [note], None
    problem = _fork_problem(device)
    if problem:
        raise TuneError(
            f"{getattr(fn, '__qualname__', fn)!r} cannot be imported by another process "
            f"(it is defined in __main__, a notebook cell, a function, or is a lambda) and "
            f"{problem}. Move it into a module beside the notebook (steps.py, then "
            "`from steps import step`), or pass isolation='none' to run the trials in this "
            "process (an out-of-memory error is then caught here)"
        )
    notes = ["trials were forked from this process, which no other process can import from"]
    if device == "cpu" and "torch" in sys.modules:
        notes.append(
            "the forked trials ran torch on one CPU thread (OpenMP's threads do not survive "
            "a fork): their samples/s are one thread's; move the function into a module "
            "for full-speed trials"
        )
    return lambda batch, cancel: _forked(fn, plan, batch, cancel), notes, None


def _fork_problem(device: str) -> str | None:
    """Why a trial cannot be forked from here, or None."""
    if not hasattr(os, "fork"):
        return "this system cannot fork"
    torch = sys.modules.get("torch")
    kind = device.partition(":")[0]
    module = getattr(torch, kind, None) if torch is not None and kind != "cpu" else None
    if module is not None and getattr(module, "is_initialized", lambda: False)():
        return f"{kind.upper()} is already initialised here (a forked child cannot use it)"
    return None


def _in_process(fn: StepFn, plan: TrialPlan, batch: int) -> Trial:
    started = time.monotonic()
    summary = measure_calls(fn, batch, plan.steps, plan.device)
    duration = time.monotonic() - started
    return measured_trial(plan, batch, summary["exit_code"], 0, None, summary, "", duration)


def _forked(fn: StepFn, plan: TrialPlan, batch: int, cancel: threading.Event) -> Trial:
    """One trial in a child forked from here; its summary comes back through a pipe."""
    readable, writable = os.pipe()
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: measure, report, and leave without running any cleanup
        code = 70
        try:
            os.close(readable)
            os.setpgid(0, 0)  # its own group, so that ending it ends what it started
            set_pdeathsig(signal.SIGKILL)
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.set_num_threads(1)
            try:
                summary = measure_calls(fn, batch, plan.steps, plan.device)
            except BaseException as exc:
                summary = {"status": "failed", "message": f"{type(exc).__name__}: {exc}"}
                summary["exit_code"] = 70
            data = json.dumps(summary, default=str).encode()
            while data:
                data = data[os.write(writable, data) :]
            code = summary["exit_code"]
        finally:
            os._exit(code)
    os.close(writable)
    try:
        code, seen, over = watch_child(pid, plan, cancel, started)
        chunks = []
        while chunk := os.read(readable, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(readable)
    summary: dict[str, Any] = {}
    with contextlib.suppress(ValueError):
        summary = json.loads(b"".join(chunks) or b"{}")
    duration = time.monotonic() - started
    return measured_trial(plan, batch, code, seen, over, summary, "", duration)
