"""One tuning trial: the script at one batch size, in a fresh process, measured.

A trial runs ``torchmem run --max-steps`` on the script with its batch-size argument
replaced, so that whatever it does (an out-of-memory error, a crash, the OOM killer) ends
that process only. On CPU the budget is on the process's peak RSS as the kernel counts it
(its ``VmHWM``, which the child reports in its summary: what ``/usr/bin/time -f %M``
shows), and a trial whose RSS crosses the budget is killed and counted as out of memory;
on an accelerator it is on the allocator's peak reserved bytes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from torchmem.probe.parent_watch import PARENT_ENV
from torchmem.record.library import new_session_path
from torchmem.tuning.search import Trial, TuneCancelled, TuneError

#: How often a running trial's RSS is checked against the budget (CPU).
WATCH_PERIOD_S = 0.02


@dataclass(frozen=True)
class TrialPlan:
    """What every trial of one tuning run shares."""

    script: str
    args: tuple[str, ...]
    #: The script's batch-size option, e.g. ``--batch-size``.
    batch_arg: str
    #: Steps measured after the first (warm-up) step.
    steps: int = 3
    #: ``cpu`` or an accelerator such as ``cuda:0``: whose memory the budget is on.
    device: str = "cpu"
    budget_bytes: int = 0
    cwd: str | None = None
    timeout_s: float = 900.0
    #: Where each trial is recorded as a session of its own (None: not recorded).
    record_dir: str | None = None

    @property
    def on_cpu(self) -> bool:
        """True when the budget is on host memory (peak RSS)."""
        return self.device == "cpu"


def substitute(args: Sequence[str], option: str, value: int) -> list[str]:
    """``args`` with ``option``'s value set to ``value``: ``--bs 8`` and ``--bs=8`` are
    replaced (every occurrence), and the option is appended when it is absent."""
    out: list[str] = []
    found = False
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == option and i + 1 < len(args):
            out += [option, str(value)]
            found = skip = True
        elif arg.startswith(option + "="):
            out.append(f"{option}={value}")
            found = True
        else:
            out.append(arg)
    if not found:
        out += [option, str(value)]
    return out


def without_option(args: Sequence[str], option: str) -> list[str]:
    """``args`` without ``option`` and its value (``--bs 8`` or ``--bs=8``): what is left
    for the search to set."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg == option and i + 1 < len(args):
            skip = True
        elif not arg.startswith(option + "="):
            out.append(arg)
    return out


def trial_command(plan: TrialPlan, batch: int, summary: str) -> list[str]:
    """The command line of one trial (shown to the user as what was run)."""
    record = []
    if plan.record_dir:
        path = new_session_path(f"{Path(plan.script).stem}-batch{batch}", Path(plan.record_dir))
        record = ["--record", str(path)]
    return [
        sys.executable, "-m", "torchmem", "run", "--quiet", "--summary", summary,
        "--max-steps", str(plan.steps + 1), "--hz", "20", *record,
        plan.script, *substitute(plan.args, plan.batch_arg, batch),
    ]  # fmt: skip


def run_trial(plan: TrialPlan, batch: int, cancel: threading.Event | None = None) -> Trial:
    """Run the script at ``batch`` in a child and measure it; TuneCancelled if ``cancel``
    is set meanwhile (the child is ended first, never left behind)."""
    cancel = cancel or threading.Event()
    with tempfile.TemporaryDirectory(prefix="torchmem-tune-") as tmp:
        summary_path = os.path.join(tmp, "summary.json")
        errors_path = os.path.join(tmp, "stderr")
        started = time.monotonic()
        with open(errors_path, "wb") as errors:
            try:
                proc = subprocess.Popen(
                    trial_command(plan, batch, summary_path),
                    cwd=plan.cwd,
                    # The trial ends with this process, whatever kills it (parent_watch).
                    env={**os.environ, PARENT_ENV: str(os.getpid())},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=errors,
                    start_new_session=True,
                )
            except OSError as exc:
                raise TuneError(f"cannot start a trial: {exc}") from None
            code, max_rss, over_budget = _wait(proc, plan, cancel, started)
        duration = time.monotonic() - started
        stderr = Path(errors_path).read_text(errors="replace")
        summary = _read_summary(summary_path)
    return measured_trial(plan, batch, code, max_rss, over_budget, summary, stderr, duration)


def _wait(
    proc: subprocess.Popen[bytes], plan: TrialPlan, cancel: threading.Event, started: float
) -> tuple[int, int, int | None]:
    """Wait for a script trial's child (see :func:`watch_child`)."""
    marker = proc.args[proc.args.index("--summary") + 1]  # type: ignore[union-attr]
    watched = psutil.Process(proc.pid)
    execed = False

    def counting() -> bool:
        # Until it has exec'd, the child still shows this process's memory.
        nonlocal execed
        execed = execed or marker in watched.cmdline()
        return execed

    try:
        code, seen, over = watch_child(proc.pid, plan, cancel, started, counting)
    except BaseException:
        # watch_child ended and reaped it: tell Popen, which would otherwise think it runs.
        proc.returncode = -signal.SIGKILL
        raise
    proc.returncode = code
    return code, seen, over


def watch_child(
    pid: int,
    plan: TrialPlan,
    cancel: threading.Event,
    started: float,
    counting: Callable[[], bool] = lambda: True,
) -> tuple[int, int, int | None]:
    """Wait for the trial child ``pid`` (a process-group leader); its exit code, the
    highest RSS seen while polling (a floor of its peak, for a child killed before it
    could report its own), and the RSS that crossed the budget (None if it stayed under).
    The child is ended, never left behind, when this raises (cancel, timeout, Ctrl+C)."""
    over: int | None = None
    seen = 0
    try:
        watched = psutil.Process(pid)
        while True:
            # Not ru_maxrss of wait4: it counts the pages of this process that the child
            # held between fork and exec (a trial from a 1 GiB window would "peak" at 1 GiB).
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                return os.waitstatus_to_exitcode(status), seen, over
            if cancel.is_set():
                raise TuneCancelled()
            if time.monotonic() - started > plan.timeout_s:
                raise TuneError(
                    f"a trial ran for more than {plan.timeout_s:g} s: lower --steps, or "
                    "check that the script stops after its steps (it must step an optimizer)"
                )
            with contextlib.suppress(psutil.Error):
                rss = watched.memory_info().rss if counting() else 0
                seen = max(seen, rss)
                if plan.on_cpu and plan.budget_bytes and over is None and rss > plan.budget_bytes:
                    over = rss  # as the OOM killer would: at once, no cleanup
                    with contextlib.suppress(OSError):
                        os.killpg(pid, signal.SIGKILL)
            time.sleep(WATCH_PERIOD_S)
    except BaseException:
        end_child(pid)
        raise


def end_child(pid: int) -> None:
    """End the trial child ``pid`` and its process group: SIGTERM, SIGKILL 5 s later."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(OSError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                return  # already reaped
            if done:
                return
            time.sleep(0.01)


def _read_summary(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}  # killed before it wrote one
    return data if isinstance(data, dict) else {}


def measured_trial(
    plan: TrialPlan,
    batch: int,
    code: int,
    max_rss: int,
    over_budget: int | None,
    summary: dict[str, Any],
    stderr: str,
    duration: float,
) -> Trial:
    """Judge one trial from its exit ``code``, the RSS watched from outside and its own
    ``summary`` (``torchmem run --summary``'s keys): fitted, out of memory, or failed and
    why."""
    from torchmem.units import format_bytes

    peaks = summary.get("peak_bytes") or {}
    steps = int(summary.get("steps") or 0)
    allocated = reserved = None
    if not plan.on_cpu:  # the fit is on reserved: what the device must actually hold
        allocated = _int(peaks.get(plan.device))
        reserved = _int((summary.get("peak_reserved_bytes") or {}).get(plan.device))
    own = _int(summary.get("peak_rss_bytes"))
    peak = (own if own is not None else max_rss) if plan.on_cpu else reserved
    step_time = summary.get("step_time_s")
    rate = batch / step_time if isinstance(step_time, (int, float)) and step_time > 0 else None
    base = {
        "batch_size": batch,
        "peak_bytes": peak,
        "peak_allocated_bytes": allocated,
        "peak_reserved_bytes": reserved,
        "samples_per_s": rate,
        "steps": steps,
        "duration_s": duration,
        "eval_forwards": _int(summary.get("eval_forwards")),
    }
    if over_budget is not None:
        message = (
            f"RSS {format_bytes(over_budget)} crossed the budget "
            f"{format_bytes(plan.budget_bytes)}: stopped, counted as out of memory"
        )
        base["peak_bytes"] = max(max_rss, over_budget)
        return Trial(**base, ok=False, oom=True, message=message)
    status = summary.get("status")
    if status == "out of memory":
        return Trial(**base, ok=False, oom=True, message=str(summary.get("message", "")))
    if code != 0:
        return Trial(**base, ok=False, oom=False, message=_failure(plan, code, summary, stderr))
    if not plan.on_cpu and reserved is None:
        return Trial(
            **base,
            ok=False,
            oom=False,
            message=f"the script reported no {plan.device} memory: it did not use "
            f"{plan.device} (set the script's own device option), or tune with --device cpu",
        )
    if steps == 0:
        return Trial(
            **base,
            ok=False,
            oom=False,
            message="the script ended without a training step (no optimizer.step() or "
            "backward() was seen): a trial measures training steps",
        )
    note = "" if steps > plan.steps else f"only {steps} step(s) ran: the script ended first"
    return Trial(**base, ok=True, oom=False, message=note)


def _failure(plan: TrialPlan, code: int, summary: dict[str, Any], stderr: str) -> str:
    if "unrecognized arguments" in stderr and plan.batch_arg in stderr:
        return (
            f"the script does not take {plan.batch_arg} (argparse: unrecognized arguments); "
            "pass --batch-arg with the option it uses for the batch size"
        )
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"the trial was killed by {signal.Signals(-code).name}"
    message = str(summary.get("message") or "").strip()
    tail = stderr.strip().splitlines()[-1] if stderr.strip() else ""
    return message or tail or f"exit code {code}"


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None
