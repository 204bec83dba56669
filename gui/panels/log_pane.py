"""The log pane: the script's stdout and stderr, and torchmem's own messages."""

from __future__ import annotations

import shlex
import time

from PySide6.QtCore import QTimer, Slot
from PySide6.QtGui import QColor, QFont, QPalette, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QPlainTextEdit, QWidget

from torchmem.events import (
    Alert,
    CommandResult,
    Event,
    LogRecord,
    RunFinished,
    RunStarted,
    Stream,
)
from torchmem.gui.bridge import SessionBridge
from torchmem.session import Session

MAX_LINES = 20000
#: A line longer than this is broken (a script that writes without newlines would
#: otherwise grow one line, which the pane's line cap never trims, for the whole run).
MAX_LINE_CHARS = 4096
#: After an insertion that took t, the next waits PACE x t (the pane's share <= 1/(1+PACE)).
PACE = 4


class LogPane(QPlainTextEdit):
    """Read-only, bounded log; stderr in red, torchmem's lines in the accent colour."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setMaximumBlockCount(MAX_LINES)
        self.setLineWrapMode(QPlainTextEdit.NoWrap)
        font = QFont("monospace")
        font.setStyleHint(QFont.TypeWriter)
        self.setFont(font)
        self.setPlaceholderText("The script's output appears here.")
        self._formats = {}
        self._separate = False
        self._pending: list[LogRecord] = []
        self._pending_lines = 0
        self._skipped = 0
        self._next_insert = 0.0
        self._pace_timer = QTimer(self)
        self._pace_timer.setSingleShot(True)
        self._pace_timer.timeout.connect(self._insert_pending)
        self.update_formats()

    def start_section(self) -> None:
        """Put a rule before whatever comes next, if there is an older run above it."""
        self._separate = not self.document().isEmpty()

    def update_formats(self) -> None:
        """Colours that stay readable on the current (light or dark) palette."""
        dark = self.palette().color(QPalette.Base).lightness() < 128
        plain = QTextCharFormat()
        err = QTextCharFormat()
        err.setForeground(QColor("#ff6b6b" if dark else "#c0392b"))
        own = QTextCharFormat()
        own.setForeground(QColor("#6cb6ff" if dark else "#1f5fa8"))
        own.setFontItalic(True)
        self._formats = {Stream.STDOUT: plain, Stream.STDERR: err, Stream.TORCHMEM: own}

    def bind(self, bridge: SessionBridge) -> None:
        """Show the Session's log, and a line for each run start, end, alert and command."""
        self._session = bridge.session
        bridge.events.connect(self.on_events)

    @Slot(list)
    def on_events(self, events: list[Event]) -> None:
        """Append what each event says, in the order the events happened: at once while
        the output is calm; under a flood, at a pace that keeps the GUI thread's share
        of the time low (see :meth:`_due`)."""
        records = [r for event in events if (r := self._record(event, self._session))]
        if records and self._separate:
            self._separate = False
            records.insert(0, LogRecord(records[0].t, Stream.TORCHMEM, "─" * 60))
        for record in records:
            self._queue(record)
        if any(isinstance(event, RunFinished) for event in events):
            self.flush()  # the run's end and its last lines, at once
        elif self._pending:
            self._due()

    def _queue(self, record: LogRecord) -> None:
        """Keep ``record`` for the next insertion; of a flood, keep only the newest
        ``MAX_LINES`` lines (the pane would drop the older ones on insertion anyway)."""
        self._pending.append(record)
        self._pending_lines += record.text.count("\n")
        keep = MAX_LINES - 2  # room for the "lines not shown" note above them
        while self._pending_lines > keep and self._pending:
            oldest = self._pending[0]
            lines = oldest.text.count("\n")
            excess = self._pending_lines - keep
            if lines <= excess:
                self._pending.pop(0)
                self._pending_lines -= lines
                self._skipped += lines
            else:  # cut the head of this one
                cut = oldest.text.split("\n", excess)[-1]
                self._pending[0] = LogRecord(oldest.t, oldest.stream, cut)
                self._pending_lines -= excess
                self._skipped += excess

    def _due(self) -> None:
        """Insert now, or when the pace allows (a single-shot timer)."""
        wait = self._next_insert - time.monotonic()
        if wait <= 0:
            self._insert_pending()
        elif not self._pace_timer.isActive():
            self._pace_timer.start(int(wait * 1000) + 1)

    @Slot()
    def _insert_pending(self) -> None:
        if not self._pending:
            return
        started = time.monotonic()
        records, self._pending, self._pending_lines = self._pending, [], 0
        if self._skipped:
            note = (
                f"… {self._skipped:,} lines not shown here (a flood of output: the "
                "terminal and the recorded session have every line)"
            )
            records.insert(0, LogRecord(records[0].t, Stream.TORCHMEM, note))
            self._skipped = 0
            # What is pending fills the pane: every line in it now would be trimmed from
            # the top, block by block, which costs 8x the insertion (0.19 s against
            # 0.02 s for 20,000 lines); a cleared document costs nothing.
            self.document().clear()
        self.append_records(records)
        took = time.monotonic() - started
        # The GUI thread shares the GIL with the script: at most a fifth of the time here.
        self._next_insert = time.monotonic() + PACE * took

    def flush(self) -> None:
        """Insert whatever is pending now (tests, and before the window shows a result)."""
        self._pace_timer.stop()
        self._insert_pending()

    def _record(self, event: Event, session: Session) -> LogRecord | None:
        if isinstance(event, LogRecord):
            return event
        if isinstance(event, RunStarted):
            where = " (in a separate process)" if event.mode == "isolated" else ""
            text = f"running{where} {shlex.join([event.script, *event.argv])}"
            return LogRecord(event.t, Stream.TORCHMEM, text)
        if isinstance(event, RunFinished):
            text = f"{event.headline(session.steps.steps)}: {event.message}"
            if event.traceback:
                text = event.traceback.rstrip() + "\n" + text
            return LogRecord(event.t, Stream.TORCHMEM, text)
        if isinstance(event, Alert) and event.is_new:
            fix = f"\n  fix: {event.suggestion}" if event.suggestion else ""
            return LogRecord(event.t, Stream.TORCHMEM, event.headline + fix)
        if isinstance(event, CommandResult):
            return LogRecord(event.t, Stream.TORCHMEM, event.said)
        return None

    def append_records(self, records: list[LogRecord]) -> None:
        """Append records in order, keeping the view at the bottom if it was there."""
        if not records:
            return
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        cursor = QTextCursor(self.document())
        cursor.movePosition(QTextCursor.End)
        cursor.beginEditBlock()
        for record in records:
            text = record.text
            if record.stream is Stream.TORCHMEM:
                text = f"[torchmem] {text}" + ("" if text.endswith("\n") else "\n")
            self._insert(cursor, text, self._formats[record.stream])
        cursor.endEditBlock()
        if at_bottom:
            bar.setValue(bar.maximum())

    @staticmethod
    def _insert(cursor: QTextCursor, text: str, fmt: QTextCharFormat) -> None:
        """Insert ``text`` as a terminal shows it: a carriage return starts the current line
        over (tqdm redraws its bar this way, ten times a second for a whole run: appended,
        those redraws made one line that grew by megabytes a day), and a line that passes
        ``MAX_LINE_CHARS`` goes on in a new one."""
        parts = text.replace("\r\n", "\n").split("\r")
        for i, part in enumerate(parts):
            if i:
                cursor.movePosition(QTextCursor.StartOfBlock, QTextCursor.KeepAnchor)
                cursor.removeSelectedText()
            if not part:
                continue
            lines = part.split("\n")
            room = MAX_LINE_CHARS - cursor.positionInBlock()
            if len(lines[0]) > room or any(len(line) > MAX_LINE_CHARS for line in lines):
                lines[0] = _wrap(lines[0], room, MAX_LINE_CHARS)
                lines[1:] = [_wrap(line, MAX_LINE_CHARS, MAX_LINE_CHARS) for line in lines[1:]]
                part = "\n".join(lines)
            cursor.insertText(part, fmt)


def _wrap(line: str, room: int, width: int) -> str:
    """``line`` broken with newlines so that no piece passes ``width`` characters, the
    first piece fitting the ``room`` left on the current line."""
    room = max(room, 0)
    if len(line) <= room:
        return line
    pieces = [line[:room]] + [line[i : i + width] for i in range(room, len(line), width)]
    return "\n".join(pieces)
