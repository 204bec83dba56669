"""A dismissible message strip at the top of the window (errors that need reading)."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QToolButton, QWidget

STYLES = {
    "error": ("#fdecea", "#8a1c12", "#e6a19a"),
    "warning": ("#fff4e5", "#6b4200", "#f0c36d"),
    "info": ("#e8f1fb", "#174a7c", "#9cc3ea"),
}


class Banner(QFrame):
    """Shows one message with a severity colour, and at most one action button; the x
    button hides it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextSelectableByMouse)
        close = QToolButton()
        close.setText("✕")
        close.setAutoRaise(True)
        close.setToolTip("Dismiss (Esc)")
        close.clicked.connect(self.hide)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 6, 6)
        self.action_button = QPushButton()
        self.action_button.hide()
        self.action_button.clicked.connect(self._on_action)
        self._action: Callable[[], None] | None = None
        layout.addWidget(self.label, 1)
        layout.addWidget(self.action_button, 0, Qt.AlignTop)
        layout.addWidget(close, 0, Qt.AlignTop)
        self.severity = "info"
        self.hide()

    def show_message(
        self,
        text: str,
        severity: str = "error",
        action: tuple[str, Callable[[], None], str] | None = None,
    ) -> None:
        """Show ``text`` in the colours of ``severity`` (error, warning, info), with an
        optional ``(label, callback, tooltip)`` button."""
        bg, fg, border = STYLES.get(severity, STYLES["info"])
        self.severity = severity
        self.setStyleSheet(
            f"Banner {{ background: {bg}; border: 1px solid {border}; border-radius: 4px; }}"
            f"QLabel {{ color: {fg}; }} QToolButton {{ color: {fg}; }}"
        )
        self.label.setText(text)
        self._action = action[1] if action else None
        if action:
            self.action_button.setText(action[0])
            self.action_button.setToolTip(action[2])
        self.action_button.setVisible(action is not None)
        self.show()

    def _on_action(self) -> None:
        callback = self._action
        self.hide()
        if callback is not None:
            callback()

    def text(self) -> str:
        """The message shown (empty when hidden)."""
        return self.label.text() if self.isVisible() else ""
