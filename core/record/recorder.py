"""Writing a Session's events to a session file as they happen, off the run's threads.

The recorder is a Session listener: it only puts each event on a bounded queue, so a
source's thread (the training loop's, in-process) never waits for a disk. A thread of its
own writes the queue in batches and commits at least every :data:`FLUSH_S` seconds, so a
``kill -9`` loses at most that much. Nothing it meets stops the run: a full disk or any
other write error ends the recording with one message (through ``on_problem``) and what
was committed stays readable.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import platform
import queue
import socket
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from torchmem import __version__
from torchmem.events import CensusTaken, Event, JobMembers, Marker, MarkerKind, Sample
from torchmem.probe.allocator import allocator_settings
from torchmem.record import store
from torchmem.record.overview import OverviewBuilder
from torchmem.session import Session

#: Longest time between two commits (s): what a kill -9 can lose.
FLUSH_S = 0.5
#: Storages kept as they are in a recorded census (the rest folded per device and kind):
#: enough that parameters, their gradients and optimizer state stay named in a diff.
CENSUS_TOP = 2000
#: Events waiting for the writer before new ones are dropped (and counted): about an hour
#: of 10 Hz samples, should the disk stall that long.
MAX_PENDING = 50_000
#: Least time between two recorded step boundaries (s). A loop of tiny steps makes
#: thousands a second; the traces' step axis interpolates between boundaries anyway, and the
#: newest boundary is always written at the next commit, so the step count stays exact.
STEP_SPACING_S = 0.05

_STOP = object()


def environment_facts() -> dict[str, Any]:
    """What a session records about where it ran (no import of torch: the version comes
    from the installed distribution)."""
    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = ""
    return {
        "torchmem_version": __version__,
        "torch_version": torch_version,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "host": socket.gethostname(),
        "user": user,
        "allocator": allocator_settings(),
    }


class Recorder:
    """Records one Session into a new session file until :meth:`close`.

    ``meta`` are facts the caller knows (script, argv, kind, devices); the environment's
    are added. ``on_problem(message)`` is called once, from the writer thread, if the
    recording has to stop early.
    """

    def __init__(
        self,
        path: str | Path,
        meta: dict[str, Any],
        on_problem: Callable[[str], None] | None = None,
    ) -> None:
        self.path = Path(path)
        #: What the file records: ``run``, ``attach`` or ``tune`` (its meta's ``kind``).
        self.kind = str(meta.get("kind", "run"))
        created = datetime.now(timezone.utc).astimezone()
        facts = {**environment_facts(), "created": created.isoformat(timespec="seconds")}
        self._conn = store.create(self.path, {**facts, **meta})
        self._on_problem = on_problem
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=MAX_PENDING)
        self._series: dict[str, int] = {}
        self._seq = 0
        self._last_step_t = -1.0
        self._held_step: Marker | None = None  # the newest boundary not yet written
        self._overview = OverviewBuilder()
        self._unsubscribe: Callable[[], None] | None = None
        self._closed = False
        #: Why the recording stopped early, or None while it is healthy.
        self.error: str | None = None
        self.dropped = 0
        self.written = 0
        self._thread = threading.Thread(
            target=self._write_loop, name="torchmem-recorder", daemon=True
        )
        self._thread.start()

    # -- feeding ---------------------------------------------------------------------------
    def attach(self, session: Session, subscribe: bool = True) -> None:
        """Record every event ``session`` receives from now on (or, without ``subscribe``,
        those the caller hands to :meth:`on_event`); its clock's zero is noted as a
        wall-clock time, so that event times read as dates."""
        self._queue.put(("meta", {"wall_t0": time.time() - session.now()}))
        if subscribe:
            self._unsubscribe = session.subscribe(self.on_event)

    def on_event(self, event: Event) -> None:
        """Queue one event (a Session listener: any thread, never blocks, never raises)."""
        if self.error is not None or self._closed:
            return
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1

    def update_meta(self, facts: dict[str, Any]) -> None:
        """Set facts learnt during the run (written in order with the events)."""
        if not self._closed:
            self._queue.put(("meta", dict(facts)))

    def close(self, final_meta: dict[str, Any] | None = None) -> None:
        """Write what is queued and ``final_meta`` (the run's summary), mark the session
        complete and close the file. Idempotent."""
        if self._closed:
            return
        if self._unsubscribe is not None:
            self._unsubscribe()
        ended = {"ended": time.time(), "complete": True, **(final_meta or {})}
        self._queue.put(("meta", ended))
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        # Folding the WAL into the file leaves one file to copy; should it fail, the WAL
        # stays beside the file and readers still see everything.
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        self._conn.close()

    # -- the writer thread -----------------------------------------------------------------
    def _write_loop(self) -> None:
        batch: list[Any] = []
        deadline = time.monotonic() + FLUSH_S
        while True:
            try:
                item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                item = None
            if item is _STOP:
                self._flush(batch, overview=True)
                return
            if item is not None:
                batch.append(item)
            if time.monotonic() >= deadline or len(batch) >= 10_000:
                self._flush(batch)
                batch = []
                deadline = time.monotonic() + FLUSH_S

    def _flush(self, batch: list[Any], overview: bool = False) -> None:
        if (not batch and self._held_step is None and not overview) or self.error is not None:
            return
        try:
            self._conn.execute("BEGIN")
            for item in batch:
                self._write(item)
            if self._held_step is not None:
                self._write(self._held_step, thin=False)
            if overview or self._overview.due():
                self._overview.seq = self._seq
                self._overview.write(self._conn)
            self._conn.execute("COMMIT")
        except (sqlite3.Error, OSError) as exc:
            self._fail(exc)

    def _write(self, item: Any, thin: bool = True) -> None:
        conn = self._conn
        if isinstance(item, tuple) and item[0] == "meta":
            conn.executemany(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                [(k, json.dumps(v)) for k, v in item[1].items()],
            )
            return
        kind = type(item).__name__
        if isinstance(item, Marker) and item.kind is MarkerKind.STEP:
            if thin:
                self._overview.add_step(item.t, item.step)
                # Closer together early on, further apart in a long run: the file holds
                # about 20,000 boundaries per factor e of run time.
                if item.t - self._last_step_t < max(STEP_SPACING_S, item.t / 20_000):
                    self._held_step = item
                    return
            self._last_step_t, self._held_step = item.t, None
            kind = "Marker:step"
        self._seq += 1
        if isinstance(item, Sample):
            for key in item.series():
                if key not in self._series:
                    self._series[key] = len(self._series) + 1
                    conn.execute(
                        "INSERT INTO series (id, key) VALUES (?, ?)", (self._series[key], key)
                    )
            self._overview.add_sample(item)
            conn.execute(
                "INSERT INTO samples (seq, t, step, vals) VALUES (?, ?, ?, ?)",
                (self._seq, item.t, item.step, store.pack_sample(item, self._series)),
            )
        else:
            if isinstance(item, CensusTaken):
                item = replace(item, census=item.census.folded(CENSUS_TOP))
            elif isinstance(item, JobMembers):
                self._overview.add_members(item)
            try:
                data = store.pack_event(item)
            except (TypeError, ValueError):  # an event this version cannot encode
                self.dropped += 1
                return
            conn.execute(
                "INSERT INTO events (seq, t, kind, data) VALUES (?, ?, ?, ?)",
                (self._seq, item.t, kind, data),
            )
        self.written += 1

    def _fail(self, exc: BaseException) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._conn.execute("ROLLBACK")
        full = "full" in str(exc).lower()
        self.error = (
            f"recording stopped: the disk is full ({exc})"
            if full
            else f"recording stopped: {type(exc).__name__}: {exc}"
        ) + f"; the run goes on, and what was recorded until now stays in {self.path}"
        if self._on_problem is not None:
            try:
                self._on_problem(self.error)
            except Exception:  # a listener's error must not end this thread
                sys.stderr.write(f"torchmem: {self.error}\n")


def start_recording(
    path: str | Path,
    session: Session,
    kind: str,
    script: str | None,
    argv: list[str] | tuple[str, ...] = (),
    cwd: str | None = None,
    on_problem: Callable[[str], None] | None = None,
    subscribe: bool = True,
    **meta: Any,
) -> Recorder:
    """Create ``path`` and record ``session`` into it (RecordError if it cannot be made):
    the one way every front end starts a recording."""
    facts = {
        "kind": kind,
        "script": str(Path(script).resolve()) if script else None,
        "argv": list(argv),
        "cwd": str(Path(cwd or os.getcwd()).resolve()),
        "pid": os.getpid(),
        **meta,
    }
    recorder = Recorder(path, facts, on_problem)
    recorder.attach(session, subscribe)
    return recorder
