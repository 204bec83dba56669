"""The log pane: the script's stdout and stderr, and torchmem's own messages."""

from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QPalette, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import QPlainTextEdit, QWidget

from torchmem.events import LogRecord, Stream

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
        self.update_formats()

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
