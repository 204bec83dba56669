"""``torchmem.serve()``: one line that makes a running script attachable.

It serves the run torchmem already monitors in this process (``torchmem run``, the
window) or starts monitoring the calling thread itself, and tells viewers how the process
ends: an uncaught exception (classified as a run's would be) or a normal exit.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from typing import Any

from torchmem.agent import Agent, running_agent
from torchmem.events import RunFinished, RunStarted, RunStatus
from torchmem.probe.runner import EXIT_STOPPED, classify_exception
from torchmem.probe.steps import ScriptStopped
from torchmem.session import Session
from torchmem.sources.inprocess import InProcessSource, active_source
from torchmem.transport.discovery import AgentEntry

_served: Agent | None = None
_served_lock = threading.Lock()


def serve(
    hz: float = 10.0, listen: str | None = None, label: str = "", max_steps: int | None = None
) -> AgentEntry:
    """Let torchmem viewers attach to this process (``torchmem.serve()``, one line).

    Samples in a daemon thread, counts steps of the calling thread, and publishes an
    entry that ``torchmem ps`` and the window's Attach dialog list. Calling it again
    returns the same entry. Nothing waits for a viewer. With ``max_steps`` (each rank of
    ``torchmem run --max-steps N -- COMMAND``, a tuning trial of a torchrun job), the
    process exits with code 0 at the end of its N-th step.
    """
    global _served
    with _served_lock:
        if _served is not None and _served.entry is not None and _served.pid == os.getpid():
            return _served.entry
        running = running_agent()
        if running is not None and running.entry is not None and running.pid == os.getpid():
            return running.entry  # `torchmem run --attachable` already serves this run
        active = active_source()
        if active is not None:  # a run of `torchmem run` or the window: serve that run
            agent = Agent(active, listen=listen, label=label)
            return agent.start()
        source = InProcessSource(Session(), hz=hz)
        main = sys.modules.get("__main__")
        # A child of multiprocessing's spawn imports torch while its __main__ is still
        # spawn's own program; its argv is already its parent's: name the script by it.
        script = getattr(main, "__file__", None) or _script_in_argv()
        source.watch_thread(threading.get_ident(), script, step_limit=max_steps)
        session = source.session
        session.submit(
            RunStarted(session.now(), script or sys.executable, tuple(sys.argv[1:]), "served")
        )
        agent = Agent(source, listen=listen, label=label)
        entry = agent.start()
        _served = agent
        _report_exit(agent, max_steps)
        return entry


def _script_in_argv() -> str | None:
    """``sys.argv[0]`` when it names a Python file (a spawned child's, copied from its
    parent), else None."""
    first = sys.argv[0] if sys.argv else ""
    return first if first.endswith(".py") and os.path.isfile(first) else None


def _report_exit(agent: Agent, max_steps: int | None = None) -> None:
    """Tell viewers how a served process ends: an uncaught exception, or a normal exit
    (after ``max_steps`` steps, when it was the step limit that ended it)."""
    session = agent.session
    started = time.monotonic()
    previous_hook = sys.excepthook

    def excepthook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
        if session.run_finished is None and agent is _served:
            import traceback

            text = "".join(traceback.format_exception(kind, exc, tb))
            status, code, message = classify_exception(exc)
            if issubclass(kind, ScriptStopped):
                first = str(exc).splitlines()[0] if str(exc) else "stopped"
                status, code, message, text = RunStatus.STOPPED, EXIT_STOPPED, first, ""
            session.submit(
                RunFinished(session.now(), status, code, message, text, time.monotonic() - started)
            )
        previous_hook(kind, exc, tb)

    def at_exit() -> None:
        if session.run_finished is None and agent is _served:
            session.submit(
                RunFinished(
                    session.now(),
                    RunStatus.FINISHED,
                    0,
                    limited
                    if max_steps and session.steps.steps >= max_steps
                    else "the process exited",
                    duration_s=time.monotonic() - started,
                )
            )

    limited = f"stopped after {max_steps} steps (--max-steps)"
    sys.excepthook = excepthook
    atexit.register(at_exit)  # after the agent's own: runs before it closes
