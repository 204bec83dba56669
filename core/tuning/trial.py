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
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import psutil

from torchmem.probe.backends import RETRIES_ENV
from torchmem.probe.parent_watch import PARENT_ENV
from torchmem.record.library import new_session_path
from torchmem.sources.children import signal_name, signal_tree
from torchmem.tuning.model import Fit, Rounding
from torchmem.tuning.outcome import THRASH_STEPS
from torchmem.tuning.search import (
    BatchSearch,
    Trial,
    TuneCancelled,
    TuneError,
    prior_share,
    resolution,
)

if TYPE_CHECKING:  # predict imports this module: the name is for the annotation only
    from torchmem.tuning.predict import Prediction

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
    #: ``script`` and ``args`` are a command line, not a Python script (``torchmem tune --
    #: torchrun ...``): a trial runs it under ``torchmem run --max-steps -- COMMAND``, and
    #: every torch process it starts (each rank) must fit.
    job: bool = False

    @property
    def on_cpu(self) -> bool:
        """True when the budget is on host memory (peak RSS)."""
        return self.device == "cpu"

    def command_line(self, batch: int) -> list[str]:
        """What the user would run at ``batch``: ``python train.py ...``, or the job's
        command."""
        args = substitute(self.args, self.batch_arg, batch)
        return [self.script, *args] if self.job else ["python", self.script, *args]


def torchrun_command(processes: int, script: str, args: Sequence[str]) -> list[str]:
    """``script`` as a torchrun job of ``processes`` ranks on this machine (the launcher as
    a module of this Python, so that no ``torchrun`` on PATH is needed)."""
    return [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}",
        "--standalone", script, *args,
    ]  # fmt: skip


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
    head = [
        sys.executable, "-m", "torchmem", "run", "--quiet", "--summary", summary,
        "--max-steps", str(plan.steps + 1), "--hz", "20",
    ]  # fmt: skip
    args = substitute(plan.args, plan.batch_arg, batch)
    if plan.job:  # every rank stops at its step limit; a job is not recorded
        return [*head, "--", plan.script, *args]
    record = []
    if plan.record_dir:
        path = new_session_path(f"{Path(plan.script).stem}-batch{batch}", Path(plan.record_dir))
        record = ["--record", str(path)]
    return [*head, *record, plan.script, *args]


def start_child(command: list[str], cwd: str | None, stderr: IO[bytes]) -> subprocess.Popen[bytes]:
    """Start a child of the search (a trial, the fake steps): its own process group, so
    that ending it ends what it started, no terminal input or output, its errors into
    ``stderr``, ended with this process whatever kills it (parent_watch), and the
    allocator's retries read at every step boundary."""
    return subprocess.Popen(
        command,
        cwd=cwd,
        # Each step's allocator retries are read, so that a size that thrashes counts as
        # not fitting (every rank of a job inherits it).
        env={**os.environ, PARENT_ENV: str(os.getpid()), RETRIES_ENV: "1"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        start_new_session=True,
    )


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
                proc = start_child(trial_command(plan, batch, summary_path), plan.cwd, errors)
            except OSError as exc:
                raise TuneError(f"cannot start a trial: {exc}") from None
            code, max_rss, over_budget = _wait(proc, plan, cancel, started)
        duration = time.monotonic() - started
        stderr = Path(errors_path).read_text(errors="replace")
        summary = _read_summary(summary_path)
    return measured_trial(plan, batch, code, max_rss, over_budget, summary, stderr, duration)


def plan_search(
    plan: TrialPlan,
    limit: float,
    minimum: int,
    maximum: int,
    rounding: Rounding = "none",
    max_trials: int = 12,
    on_trial: Callable[[Trial, Fit | None], None] | None = None,
    cancel: threading.Event | None = None,
    prediction: Prediction | None = None,
) -> BatchSearch:
    """The search of ``plan``'s trials, as ``torchmem tune`` and the Tune panel both run
    it: one construction, so that the two give the same answer for the same settings.
    ``prediction``: the fake steps', if they ran (their model is the search's prior;
    where their tensors stayed flat, a rise must be larger to count)."""
    cancel = cancel or threading.Event()
    return BatchSearch(
        lambda batch, role, predicted: run_trial(plan, batch, cancel),
        limit,
        minimum,
        maximum,
        rounding,
        max_trials,
        on_trial,
        cancel,
        prior=prediction.fit if prediction is not None else None,
        prior_share=prior_share(plan.device),
        resolution=resolution(plan.device, prediction is not None and prediction.flat),
    )


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

    memory = JobMemory(proc.pid) if plan.job else None
    try:
        code, seen, over = watch_child(proc.pid, plan, cancel, started, counting, memory)
    except BaseException:
        # watch_child ended and reaped it: tell Popen, which would otherwise think it runs.
        proc.returncode = -signal.SIGKILL
        raise
    proc.returncode = code
    return code, seen, over


class JobMemory:
    """The host memory of a job trial: every process under the trial's ``torchmem run``
    (the launcher and each rank; not the monitor itself), read from /proc.

    All ranks of a job share this machine's RAM, so the budget is on their sum. The peak
    is the sum of each process's own peak RSS as the kernel counts it (``VmHWM``, kept
    after the process is gone): what the machine must hold when the ranks peak together,
    as DDP's lockstep makes them."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.peaks: dict[int, int] = {}

    def poll(self) -> int:
        """The processes' RSS now (their sum); updates :attr:`peak`."""
        now = 0
        try:
            children = psutil.Process(self.root).children(recursive=True)
        except psutil.Error:
            return 0
        for child in children:
            rss, hwm = _rss_and_peak(child.pid)
            now += rss
            if hwm:
                self.peaks[child.pid] = max(self.peaks.get(child.pid, 0), hwm)
        return now

    @property
    def peak(self) -> int:
        """The sum of every process's peak RSS seen so far."""
        return sum(self.peaks.values())


def _rss_and_peak(pid: int) -> tuple[int, int]:
    """``VmRSS`` and ``VmHWM`` of ``pid`` in bytes (0, 0 when it is gone)."""
    rss = hwm = 0
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith(b"VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return rss, hwm


def watch_child(
    pid: int,
    plan: TrialPlan,
    cancel: threading.Event,
    started: float,
    counting: Callable[[], bool] = lambda: True,
    job: JobMemory | None = None,
) -> tuple[int, int, int | None]:
    """Wait for the trial child ``pid`` (a process-group leader); its exit code, the
    highest RSS seen while polling (a floor of its peak, for a child killed before it
    could report its own; for a ``job``, the sum of its processes' peaks), and the RSS
    that crossed the budget (None if it stayed under). The child and everything it
    started are ended, never left behind, when this raises (cancel, timeout, Ctrl+C)."""
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
                if job is not None:
                    rss = job.poll()
                    seen = max(seen, job.peak)
                else:
                    rss = watched.memory_info().rss if counting() else 0
                    seen = max(seen, rss)
                if plan.on_cpu and plan.budget_bytes and over is None and rss > plan.budget_bytes:
                    over = rss  # as the OOM killer would: at once, no cleanup
                    signal_tree(pid, signal.SIGKILL)
            time.sleep(WATCH_PERIOD_S)
    except BaseException:
        end_child(pid)
        raise


def end_child(pid: int) -> None:
    """End the trial child ``pid`` and everything it started: SIGTERM (a launcher ends
    its ranks), SIGKILL 5 s later."""
    for sig, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        signal_tree(pid, sig)
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

    steps = int(summary.get("steps") or 0)
    ranks = len(summary.get("ranks") or []) if plan.job else None
    allocated = reserved = None
    if not plan.on_cpu:  # the fit is on reserved: what the device must actually hold
        if plan.job:  # each rank on a device of its own: the fullest one must fit
            rows = summary.get("ranks") or []
            allocated = worst_rank_peak(rows, "peak_bytes", plan.device)
            reserved = worst_rank_peak(rows, "peak_reserved_bytes", plan.device)
        else:
            allocated = _int((summary.get("peak_bytes") or {}).get(plan.device))
            reserved = _int((summary.get("peak_reserved_bytes") or {}).get(plan.device))
    own = _int(summary.get("peak_rss_bytes"))
    peak = (own if own is not None else max_rss or None) if plan.on_cpu else reserved
    step_time = summary.get("step_time_s")
    # A job's samples per second are its ranks' together: each rank takes a batch.
    samples = batch * (ranks or 1)
    rate = samples / step_time if isinstance(step_time, (int, float)) and step_time > 0 else None
    base = {
        "batch_size": batch,
        "peak_bytes": peak,
        "peak_allocated_bytes": allocated,
        "peak_reserved_bytes": reserved,
        "samples_per_s": rate,
        "steps": steps,
        "duration_s": duration,
        "eval_forwards": _int(summary.get("eval_forwards")),
        "ranks": ranks,
        "retry_steps": max((summary.get("alloc_retry_steps") or {}).values(), default=0),
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
    after_measuring = ""
    if code != 0 and plan.job and _every_rank_reached_the_limit(plan, summary):
        # Each rank reported its last step measured and its exit: what failed came after
        # (a rank's teardown), not the batch.
        after_measuring = (
            f"every rank made its {plan.steps + 1} steps, then the job exited with code "
            f"{code}{_in_brackets(_job_cause(stderr.splitlines())[:200])}: a failure at "
            "exit, after the measurement; the trial counts"
        )
    elif code != 0:
        return Trial(**base, ok=False, oom=False, message=_failure(plan, code, summary, stderr))
    if plan.job and not ranks:
        return Trial(
            **base,
            ok=False,
            oom=False,
            message="the command started no process that imports torch: give the "
            "command that trains (torchrun ... train.py, python train.py)",
        )
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
    note = after_measuring or note
    if base["retry_steps"] >= THRASH_STEPS:
        note = (
            f"the allocator freed its cache and retried on {base['retry_steps']} consecutive "
            "steps (num_alloc_retries): the edge of out of memory, slower, and the next "
            "run may fail; counted as not fitting"
        )
    return Trial(**base, ok=True, oom=False, message=note)


def _in_brackets(text: str) -> str:
    return f" ({text})" if text else ""


def _every_rank_reached_the_limit(plan: TrialPlan, summary: dict[str, Any]) -> bool:
    """True when each rank of a job trial reported that it finished at the step limit."""
    rows = summary.get("ranks") or []
    return bool(rows) and all(
        row.get("run_status") == "finished" and int(row.get("steps") or 0) > plan.steps
        for row in rows
    )


def worst_rank_peak(ranks: list[dict[str, Any]], field: str, device: str) -> int | None:
    """The highest of a job's per-rank peaks (``field`` of each row of the summary's
    ``ranks``: ``{"cuda:1": bytes}``) on devices of ``device``'s type: each rank of a
    job has its own device (``cuda:LOCAL_RANK``), and the search must fit the fullest one."""
    kind = device.partition(":")[0]
    values = [
        int(v)
        for row in ranks
        for name, v in (row.get(field) or {}).items()
        if name.partition(":")[0] == kind and isinstance(v, (int, float))
    ]
    return max(values) if values else None


def _unrecognized_arguments(stderr: str) -> list[str]:
    """The arguments argparse refused (``error: unrecognized arguments: --device cuda:0``),
    from its error line alone: its usage line lists every option the script does take."""
    for line in reversed(stderr.splitlines()):
        _, found, rest = line.partition("unrecognized arguments:")
        if found:
            return rest.split()
    return []


def _failure(plan: TrialPlan, code: int, summary: dict[str, Any], stderr: str) -> str:
    unrecognized = _unrecognized_arguments(stderr)
    if plan.batch_arg in (arg.partition("=")[0] for arg in unrecognized):  # or --bs=8
        return (
            f"the script does not take {plan.batch_arg} (argparse: unrecognized arguments); "
            "pass --batch-arg with the option it uses for the batch size"
        )
    if unrecognized:  # the usage line names the batch option too: it is not the culprit
        return (
            f"the script does not take {' '.join(unrecognized)} (argparse: unrecognized "
            "arguments); the arguments after the script are its own (tune's options go before it)"
        )
    if code < 0:
        return f"the trial was killed by {signal_name(code)}"
    message = str(summary.get("message") or "").strip()
    lines = stderr.strip().splitlines()
    if plan.job:
        return _job_failure(code, message, lines)
    return message or (lines[-1] if lines else f"exit code {code}")


def _job_failure(code: int, message: str, lines: list[str]) -> str:
    """Why a job trial failed, the cause first: a rank that a signal ended reports
    nothing itself (the rank that then lost its peer does, and is not the cause); with no
    rank's report, the launcher's error line, where torchmem's own closing line only says
    "exited with code 1"."""
    if message:
        signalled = _signalled_rank(lines)
        if signalled and not message.startswith(f"{signalled.rpartition(' was ')[0]}:"):
            return f"{signalled}; then {message}"
        return message
    cause = _job_cause(lines)
    return f"{cause[:300]} (the job exited with code {code})" if cause else f"exit code {code}"


def _job_cause(lines: list[str]) -> str:
    """The rank a signal ended, if torchrun saw that first (the others' errors follow
    from it), else the launcher's error line."""
    return _signalled_rank(lines) or _launcher_cause(lines)


def _signalled_rank(lines: list[str]) -> str:
    """``rank 1 was ended by SIGABRT`` when torchrun's first failure was a signal."""
    ended = _rank_exit(lines)
    return _exit_words(*ended) if ended is not None and ended[1] < 0 else ""


#: Lines of torchrun's failure report that name no cause: a CI failure said only
#: "(error_file: <N/A>)", the report's last line with "error" in it.
_LAUNCHER_REPORT = ("error_file:", "elastic/errors.html", "ChildFailedError")
_EXCEPTION_LINE = re.compile(r"^(\[rank\d+\]:\s*)?([\w.]*(Error|Exception)\b|what\(\):)")
#: A traceback's frame line: another CI failure said only ``File ".../errors/__init__.py",
#: line 367, in wrapper``, whose path has "error" in it.
_FRAME_LINE = re.compile(r'^(\[rank\d+\]:\s*)?File "')
#: Where torchrun says which rank ended how: its report's ``rank : 1 (local_rank: 1)`` and
#: ``exitcode : -6 (pid: 4242)``, or its log's ``failed (exitcode: -6) local_rank: 1``.
_REPORT_RANK = re.compile(r"^rank\s*:\s*(\d+)")
_REPORT_EXIT = re.compile(r"^exitcode\s*:\s*(-?\d+)")
#: A line that says what went wrong without an exception: ``python: can't open file
#: '/work/train.py': [Errno 2] No such file or directory`` (a mistyped script).
_ERROR_WORDS = re.compile(r"error|errno|can't open file", re.IGNORECASE)
_LOG_EXIT = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")


def _launcher_cause(lines: list[str]) -> str:
    """Why a job failed, from its ``stderr``: a rank's (or the launcher's) last exception
    line or C++ ``what():``; else the last line that mentions an error (``can't open
    file ... No such file or directory``); else the rank and exit code torchrun reported
    (a rank that a signal ended prints nothing).
    torchmem's own lines, torchrun's report boilerplate and traceback frames are never
    causes."""
    candidates = [
        line.strip()
        for line in lines
        if not line.startswith("torchmem:") and not any(r in line for r in _LAUNCHER_REPORT)
    ]
    candidates = [line for line in candidates if not _FRAME_LINE.match(line)]
    exceptions = [line for line in candidates if _EXCEPTION_LINE.match(line)]
    errors = exceptions or [line for line in candidates if _ERROR_WORDS.search(line)]
    if errors:
        return errors[-1]
    ended = _rank_exit(candidates)
    return _exit_words(*ended) if ended is not None else ""


def _rank_exit(lines: list[str]) -> tuple[str | None, int] | None:
    """The rank and exit code of torchrun's root cause (the first failure it saw; the
    ranks it then stopped are listed before it), or of its log's failure line."""
    lines = [line.strip() for line in lines]
    root = next((i for i, line in enumerate(lines) if line.startswith("Root Cause")), 0)
    rank = None
    for line in lines[root:]:
        if m := _REPORT_RANK.match(line):
            rank = m.group(1)
        elif m := _REPORT_EXIT.match(line):
            return rank, int(m.group(1))
        elif m := _LOG_EXIT.search(line):
            return m.group(2), int(m.group(1))
    return None


def _exit_words(rank: str | None, code: int) -> str:
    """``rank 1 was ended by SIGABRT``, ``rank 0 exited with code 2``."""
    who = f"rank {rank}" if rank is not None else "a rank"
    how = f"was ended by {signal_name(code)}" if code < 0 else f"exited with code {code}"
    return f"{who} {how}"


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None
