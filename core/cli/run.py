"""``torchmem run``: a script with the same sampler, no Qt, and a JSON summary.

A separate-process run of the window and each tuning trial are this command in a child
(`torchmem run --attachable`, `--summary`); the script runs in
the main thread (so signals, DataLoader workers and Ctrl+C behave as in plain Python),
its output goes straight to the terminal, and the exit code is the script's.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from torchmem.events import (
    AlertKind,
    Event,
    LogRecord,
    RunFinished,
    RunStatus,
    Stream,
)
from torchmem.leaks.oom import explain_oom
from torchmem.probe.backends import peak_rss
from torchmem.probe.eval_watch import EvalWatch
from torchmem.probe.parent_watch import ParentWatch
from torchmem.probe.runner import EXIT_STOPPED
from torchmem.probe.torch_import import pause_collector_for_lazy_imports
from torchmem.record.recorder import start_recording
from torchmem.record.store import RecordError
from torchmem.report.summary import build_summary, step_time, write_summary
from torchmem.session import Session, peak_label
from torchmem.sources.base import Script
from torchmem.sources.inprocess import InProcessSource
from torchmem.units import format_bytes

#: Exit code of ``torchmem run --fail-on-leak`` when a leak alert fired.
EXIT_LEAK = 4
LEAK_KINDS = (AlertKind.LEAK, AlertKind.EPOCH_GROWTH, AlertKind.WORKER_GROWTH)


def summary(session: Session, source: InProcessSource, result: RunFinished) -> dict[str, Any]:
    """The run's summary as written by ``--summary``."""
    started = session.run_started
    return build_summary(
        "run",
        session,
        script=started.script if started else None,
        argv=list(started.argv) if started else [],
        status=result.status.value,
        message=result.message,
        exit_code=result.exit_code,
        duration_s=round(result.duration_s, 3),
        traceback=result.traceback,
        steps=source.steps_seen,  # the runner's own count
        step_time_s=step_time(session),
        peak_rss_bytes=peak_rss(),  # the whole run's, not only what the sampler saw
        peak_reserved_bytes=session.peaks_of("reserved"),
    )


def _warn(message: str) -> None:
    sys.stderr.write(f"torchmem: {message}\n")


def _say_notes(event: Event) -> None:
    """torchmem's own remarks on the run (a census that failed, say) go to the terminal as
    they happen: headless, there is no Log pane to show them."""
    if isinstance(event, LogRecord) and event.stream is Stream.TORCHMEM:
        sys.__stderr__.write(f"torchmem: {event.text}\n")


def _tell(
    session: Session,
    result: RunFinished,
    data: dict[str, Any],
    oom: Any,
    quiet: bool,
    recorder: Any,
) -> None:
    """The run's account on the terminal: where it was recorded, the script's traceback,
    the closing line (unless quiet and fine), an OOM's explanation, and every alert."""
    if recorder is not None and recorder.error is None and not quiet:
        sys.stderr.write(f"torchmem: recorded in {recorder.path}\n")
    if result.traceback:
        sys.stderr.write(result.traceback)
    if not quiet or result.status is not RunStatus.FINISHED:
        peaks = ", ".join(
            f"{peak_label(k)} {format_bytes(v)}" for k, v in data["peak_bytes"].items()
        )
        sys.stderr.write(
            f"torchmem: {result.message} (exit code {result.exit_code}) after "
            f"{result.duration_s:.1f} s, {data['steps']} steps, {data['samples']} samples; "
            f"peaks: {peaks or 'none'}\n"
        )
    if oom is not None:
        sys.stderr.write("".join(f"torchmem: {line}\n" for line in oom.lines()))
    for alert in session.alert_list():
        sys.stderr.write(
            f"torchmem: {alert.severity.upper()} {alert.kind} ({alert.state}, first at step "
            f"{alert.first_step}): {alert.said}\n"
            + (f"torchmem:   fix: {alert.suggestion}\n" if alert.suggestion else "")
        )


def run_headless(
    script: str,
    args: list[str],
    summary_path: str | None = None,
    hz: float = 10.0,
    cwd: str | None = None,
    quiet: bool = False,
    fail_on_leak: bool = False,
    attachable: bool = False,
    listen: str | None = None,
    wait_attach: float = 0.0,
    max_steps: int | None = None,
    record: str | None = None,
    echo: bool = True,
) -> int:
    """Run ``script`` with monitoring; return its exit code (130 when interrupted).

    With ``fail_on_leak``, a run that raised a leak alert exits with :data:`EXIT_LEAK`
    (unless the script itself failed: its own code wins). With ``max_steps``, the script
    is stopped at its step boundary after that many steps, and that counts as success
    (exit code 0): how tuning trials and quick checks run a few steps of a long training.
    With ``record``, the run is written into that new session file as it happens.
    Without ``echo`` (an isolated run's child, whose window shows all of it), neither the
    script's captured output nor torchmem's account of the run is written to the terminal.
    """
    session = Session()
    if echo:
        session.subscribe(_say_notes)
    pause_collector_for_lazy_imports()  # the script's first optimizer starts sooner
    source = InProcessSource(session, hz=hz)
    recorder = None
    if record:
        try:
            recorder = start_recording(record, session, "run", script, args, cwd, on_problem=_warn)
        except RecordError as exc:
            sys.stderr.write(f"torchmem: {exc}\n")
            source.close()
            return 2
    # A few steps of a long training (a tuning trial): did they include an evaluation?
    evals = EvalWatch() if max_steps else None
    if evals is not None:
        evals.start()
    # An isolated run of the window ends with the window, whatever killed it: from here on,
    # including the wait for the window to attach.
    watch = ParentWatch.from_environment(
        lambda: source.request_stop(grace_s=2.0) if source.running else os._exit(EXIT_STOPPED)
    )
    agent = None
    if attachable or listen:
        from torchmem.agent import Agent
        from torchmem.transport.discovery import DiscoveryError

        agent = Agent(source, listen=listen)
        try:
            entry = agent.start()
        except (OSError, DiscoveryError) as exc:
            sys.stderr.write(f"torchmem: cannot start the agent: {exc}\n")
            if watch is not None:
                watch.close()
            if recorder is not None:
                recorder.close()
            return 2
        if not quiet:
            sys.stderr.write(
                f"torchmem: attachable as pid {entry.pid} "
                f"(torchmem attach {entry.pid}, or the window's Attach dialog)\n"
            )
        if wait_attach > 0 and not agent.first_viewer.wait(wait_attach):
            sys.stderr.write(
                f"torchmem: no viewer attached within {wait_attach:g} s; running anyway\n"
            )
    try:
        result = source.run_script(
            Script(
                script,
                tuple(args),
                cwd,
                capture_output=agent is not None,
                echo=echo,
                max_steps=max_steps or None,
            )
        )
    finally:
        if evals is not None:
            evals.stop()
        if watch is not None:
            watch.close()
        source.close()
        if agent is not None:
            agent.close()
    data = summary(session, source, result)
    if max_steps:
        data["max_steps"] = max_steps
        data["eval_forwards"] = evals.forwards if evals is not None else None
    oom = explain_oom(session)
    if oom is not None:
        data["oom"] = oom.to_json()
    if recorder is not None:
        recorder.close({"summary": data})
    if echo:
        _tell(session, result, data, oom, quiet, recorder)
    leaks = [a for a in session.alert_list() if a.kind in LEAK_KINDS]
    if summary_path and not write_summary(summary_path, data):
        return result.exit_code or 1
    if fail_on_leak and leaks and result.exit_code == 0:
        sys.stderr.write(
            f"torchmem: --fail-on-leak: {len(leaks)} leak alert(s), exit {EXIT_LEAK}\n"
        )
        return EXIT_LEAK
    return result.exit_code
