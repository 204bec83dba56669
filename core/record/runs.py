"""Recording every run a Session sees, each into a file of its own (the window's default).

A Session listener: a ``RunStarted`` opens a new session file in the sessions folder (with
the readings that came just before it), :meth:`RunRecorder.end_run` closes it with the
run's summary once the run is over, and the folder is then kept under its size cap.
Closing runs on a thread of its own, so the end of a run never waits for the disk;
:meth:`RunRecorder.close` waits for every file before the program exits.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torchmem.events import CensusTaken, Event, RunFinished, RunStarted
from torchmem.record.library import DEFAULT_CAP_BYTES, new_session_path, prune, sessions_dir
from torchmem.record.recorder import Recorder, start_recording
from torchmem.record.store import RecordError
from torchmem.session import Session

Summarize = Callable[[Session], dict[str, Any]]
#: Events kept from before a run's start (a few seconds of readings at 100 Hz).
EARLY_EVENTS = 2000


class RunRecorder:
    """Records each run of ``session`` into ``folder`` while :attr:`enabled`.

    ``summarize(session)`` builds the summary stored when a run ends; ``on_problem``
    hears, once per run, why a recording could not be made or had to stop.
    """

    def __init__(
        self,
        session: Session,
        folder: Path | None = None,
        cap_bytes: int = DEFAULT_CAP_BYTES,
        summarize: Summarize | None = None,
        on_problem: Callable[[str], None] | None = None,
    ) -> None:
        self.session = session
        self.folder = folder
        self.cap_bytes = cap_bytes
        self.enabled = True
        self._summarize = summarize
        self._on_problem = on_problem
        # Re-entrant: on_problem may note a line in the Session, which comes back here.
        self._lock = threading.RLock()
        self.current: Recorder | None = None
        #: Where the next run is recorded instead of a new file of the folder (the
        #: window's ``--record FILE``); used once, and recorded even while disabled.
        self.next_path: Path | None = None
        #: The newest finished (or current) recording's file.
        self.last_path: Path | None = None
        self._closers: list[threading.Thread] = []
        # Events before a run's start (the sampler's first readings) wait here, so that the
        # file holds every reading the window showed; bounded, and dropped at a reset.
        self._early: deque[Event] = deque(maxlen=EARLY_EVENTS)
        self._early_t0 = session.t0
        self._run_ended = False
        self._unsubscribe = session.subscribe(self._on_event)

    def _on_event(self, event: Event) -> None:
        # Every event passes here, under one lock, and reaches the file in this order.
        if isinstance(event, RunStarted) and event.mode in RECORDED_MODES:
            if self.current is not None and self._run_ended:
                self.end_run()  # the next run started before the window said this one ended
            self._start(event)
            return
        with self._lock:
            if isinstance(event, RunFinished):
                self._run_ended = True  # closed at end_run: readings after it still count
            if self.current is not None:
                self.current.on_event(event)
                return
            if self.session.t0 != self._early_t0:  # the Session was reset since
                self._early.clear()
                self._early_t0 = self.session.t0
            if isinstance(event, CensusTaken):  # only the newest: a census can be 20 MB
                kept = [e for e in self._early if not isinstance(e, CensusTaken)]
                self._early = deque(kept, maxlen=EARLY_EVENTS)
            self._early.append(event)

    def _start(self, started: RunStarted) -> None:
        with self._lock:
            if self.current is not None:  # a run's start said twice (isolated, its child)
                self.current.on_event(started)
                if started.allocator:
                    self.current.update_meta({"allocator": dict(started.allocator)})
                return
            early, self._early = list(self._early), deque(maxlen=EARLY_EVENTS)
            chosen, self.next_path = self.next_path, None
            if not self.enabled and chosen is None:
                return
            folder = self.folder or sessions_dir()
            path = chosen or new_session_path(started.script, folder)
            try:
                recorder = start_recording(
                    path, self.session, _KINDS.get(started.mode, "run"), started.script,
                    started.argv, on_problem=self._on_problem, subscribe=False,
                    mode=started.mode,
                    **({"allocator": dict(started.allocator)} if started.allocator else {}),
                )  # fmt: skip
            except RecordError as exc:
                if self._on_problem:
                    self._on_problem(f"this run is not recorded: {exc}")
                return
            for event in early:
                recorder.on_event(event)
            recorder.on_event(started)
            self.current, self.last_path = recorder, path
            self._run_ended = False

    def end_run(self) -> None:
        """Close the current recording with the run's summary: the window calls it when
        its run controller says a run is over (every reading of it is in)."""
        with self._lock:
            recorder, self.current = self.current, None
        if recorder is None:
            return
        summary: dict[str, Any] = {}
        if self._summarize is not None:
            try:
                summary = {"summary": self._summarize(self.session)}
            except Exception as exc:  # a summary that cannot be built still ends the file
                summary = {"summary_error": f"{type(exc).__name__}: {exc}"}
        if recorder.kind == "attach":
            # A detach is not the process's end: the file says which it was (as
            # `torchmem attach --record` does), never reads as a crash.
            summary["detached"] = self.session.run_finished is None
        closer = threading.Thread(
            target=self._close_one, args=(recorder, summary), name="torchmem-recorder-close"
        )
        self._closers.append(closer)
        closer.start()

    def _close_one(self, recorder: Recorder, final: dict[str, Any]) -> None:
        recorder.close(final)
        folder = self.folder or sessions_dir()
        keep = (recorder.path,) + ((self.current.path,) if self.current else ())
        try:
            prune(folder, self.cap_bytes, keep=keep)
        except OSError as exc:
            if self._on_problem:
                self._on_problem(f"cannot trim the sessions folder {folder}: {exc}")

    def wait_closed(self) -> None:
        """Wait until every ended run's file is closed (complete and readable)."""
        for closer in list(self._closers):
            closer.join()

    def close(self) -> None:
        """Stop recording: the current file is closed as it is (marked complete only by a
        run's end), and every closing file is waited for."""
        self._unsubscribe()
        if self._run_ended:
            # The run's end is in the file, but the window closed before it said the run
            # was over: the file ends as end_run would, with its summary. Closed as it
            # was, it listed as "interrupted", no peak, no alerts, where its report said
            # "stopped at step 137", 1.01 GiB and a leak.
            self.end_run()
        with self._lock:
            recorder, self.current = self.current, None
        if recorder is not None:
            recorder.close({"complete": False})
        for closer in self._closers:
            closer.join()
        self._closers.clear()


#: RunStarted.mode -> the kind a session file records.
_KINDS = {"thread": "run", "isolated": "run", "served": "attach", "watch": "attach"}
#: Runs the window records: those it started, and those it attached to (closed at the
#: detach with ``detached``: the process went on, the file does not read as a crash).
RECORDED_MODES = ("thread", "isolated", "served", "watch")
