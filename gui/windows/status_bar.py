"""A status bar whose messages never run into its permanent labels on the right."""

from __future__ import annotations

from PySide6.QtCore import Qt, Slot
from PySide6.QtWidgets import QStatusBar, QWidget


class ElidingStatusBar(QStatusBar):
    """Elides a temporary message to the room left of the permanent widgets (a long one
    once ran into the run label: "…runs scripts in :Failed (exit code 1)"); the whole
    message stays in the tooltip."""

    #: Below this width (the window is still being laid out) nothing is elided.
    MIN_WIDTH = 120

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._permanent: list[QWidget] = []
        self.full_message = ""

    def addPermanentWidget(self, widget: QWidget, stretch: int = 0) -> None:
        """As QStatusBar's; remembered so that messages stop short of it."""
        self._permanent.append(widget)
        super().addPermanentWidget(widget, stretch)

    @Slot(str, int)
    def showMessage(self, text: str, timeout: int = 0) -> None:
        """Show ``text`` for ``timeout`` ms, elided to the free room; full in the tooltip."""
        self.full_message = text
        room = self.width() - sum(w.width() + 12 for w in self._permanent if w.isVisible()) - 16
        shown = text
        if room >= self.MIN_WIDTH:
            shown = self.fontMetrics().elidedText(text, Qt.ElideRight, room)
        self.setToolTip(text if shown != text else "")
        super().showMessage(shown, timeout)
