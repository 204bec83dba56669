"""Coalesce a script's output into few log events.

``print`` makes two writes (the text, then the newline); a training loop that prints
every step makes thousands a second, and one event each crosses the Session's lock, every
listener, the recorder and the window's GIL-sharing GUI thread: a script printing 300,000
lines took 49 s in the window against 4 s headless. Writes of one stream are joined into
one event at most every ``BATCH_S`` (a quiet script's line still goes out at once, with
its newline; a text without one within ``BATCH_S``), and any
other event of the run first flushes what is pending, so the order of lines and markers is
kept.

The echo to the terminal goes out with the batch too, not write by write. A write to a
file descriptor releases the GIL, and in the window the GUI thread then holds it for up to
a switch interval (5 ms) before the script gets it back: echoing every 8 KiB (a pipe) or
every line (a terminal) made a printing script 2.2x slower in the window than headless,
and all of it was waiting. One echo per batch pays that at most 20 times a second.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from torchmem.events import Event, LogRecord, Stream

#: A pending batch goes out this long after the previous one, at the latest.
BATCH_S = 0.05
#: ... or as soon as it holds this many characters.
MAX_CHARS = 1 << 16


class LogBatcher:
    """Joins writes of one stream into one :class:`LogRecord` per ``BATCH_S``.

    A pending batch goes out at the latest ``BATCH_S`` after the previous one, sent by one
    long-lived thread that waits on a condition. (A timer thread per batch cost a script
    that prints every step 260 µs a step: starting it, and joining it at the step's
    flush.) :meth:`close` ends that thread with the run; later writes go out at once.
    """

    def __init__(
        self,
        emit: Callable[[Event], None],
        now: Callable[[], float],
        echo: Callable[[Stream, str], None] | None = None,
    ) -> None:
        self._emit = emit
        #: Called with each batch's text before its event, under the lock, so that the
        #: terminal gets the batches in the order they were written.
        self._echo = echo
        self._now = now
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stream: Stream | None = None
        self._parts: list[str] = []
        self._chars = 0
        self._t = 0.0
        self._first = 0.0  # when the pending batch's first write came (monotonic)
        self._last_sent = 0.0
        self._thread: threading.Thread | None = None
        #: After :meth:`close`: no thread, every write is sent at once.
        self._closed = False

    def write(self, stream: Stream, text: str) -> None:
        """Log ``text`` of ``stream``: now if the last batch left ``BATCH_S`` ago, else
        with the next batch."""
        if not text:
            return
        with self._lock:
            if self._stream is not None and stream is not self._stream:
                self._send_locked()
            if not self._parts:
                self._t = self._now()
                self._first = time.monotonic()
            self._stream = stream
            self._parts.append(text)
            self._chars += len(text)
            if (
                self._closed
                or self._chars >= MAX_CHARS
                or (time.monotonic() - self._last_sent >= BATCH_S and text.endswith("\n"))
            ):
                self._send_locked()
            elif self._thread is None:
                self._thread = threading.Thread(
                    target=self._send_due, name="torchmem-log-batch", daemon=True
                )
                self._thread.start()
            elif len(self._parts) == 1:
                self._wake.notify()  # the sender waits without a deadline while idle

    def flush(self) -> None:
        """Send what is pending now (before another event of the run, and at its end)."""
        with self._lock:
            self._send_locked()

    def close(self) -> None:
        """Send what is pending and end the sending thread (at the run's end); a write
        after this (a thread the script left running) is sent at once."""
        with self._lock:
            self._send_locked()
            self._closed = True
            thread, self._thread = self._thread, None
            self._wake.notify()
        if thread is not None and thread is not threading.current_thread():
            thread.join()  # no thread of the run outlives it

    def reopen(self) -> None:
        """Batch again (a new run of the same runner)."""
        with self._lock:
            self._closed = False

    def _send_due(self) -> None:
        with self._lock:
            while not self._closed:
                if not self._parts:
                    self._wake.wait()
                    continue
                due = self._last_sent + BATCH_S
                if not self._parts[-1].endswith("\n"):
                    # print() writes its newline microseconds after its text: a quiet
                    # script's line waits for it, so that a line never arrives in two
                    # halves with another process's output between them (an isolated
                    # run's workers). A prompt without a newline still shows in BATCH_S.
                    due = max(due, self._first + BATCH_S)
                due -= time.monotonic()
                if due > 0:
                    self._wake.wait(due)
                    continue
                self._send_locked()

    def _send_locked(self) -> None:
        if self._parts and self._stream is not None:
            text = "".join(self._parts)
            self._parts.clear()
            self._chars = 0
            self._last_sent = time.monotonic()
            if self._echo is not None:
                self._echo(self._stream, text)
            self._emit(LogRecord(self._t, self._stream, text))
