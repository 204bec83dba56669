"""The log pane: the script's stdout and stderr, and torchmem's own messages."""

from __future__ import annotations

import shlex

from PySide6.QtCore import Slot
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
from torchmem.session import Session

from .bridge import SessionBridge

MAX_LINES = 20000


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
        """Append what each event says, in the order the events happened."""
        records = [r for event in events if (r := self._record(event, self._session))]
        if records and self._separate:
            self._separate = False
            records.insert(0, LogRecord(records[0].t, Stream.TORCHMEM, "─" * 60))
        self.append_records(records)

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
            return LogRecord(event.t, Stream.TORCHMEM, event.message)
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
            cursor.insertText(text, self._formats[record.stream])
        cursor.endEditBlock()
        if at_bottom:
            bar.setValue(bar.maximum())
