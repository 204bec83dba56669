"""The Alerts panel: leaks and capacity problems, newest first, with what to do."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from torchmem.events import Alert, AlertState, Severity
from torchmem.gui.bridge import SessionBridge
from torchmem.session import Session
from torchmem.units import format_bytes

SEVERITY_COLORS = {Severity.CRITICAL: "#d62728", Severity.WARNING: "#ff7f0e"}
RESOLVED_COLOR = "#2ca02c"


def culprit_filter(alert: Alert) -> str:
    """Words that select an alert's top culprit in the Tensors panel's filter."""
    if not alert.culprits:
        return ""
    name = alert.culprits[0]["name"].removeprefix("saved by the graph of ")
    for cut in ("[#]", "['#']", ":"):
        name = name.split(cut)[0]
    return name.strip()


class AlertPanel(QWidget):
    """Alert list with details, a jump to the culprits, and mute."""

    #: The user wants the Tensors panel filtered to these words.
    show_tensors = Signal(str)
    #: The user muted the alert with this key.
    mute_requested = Signal(str)
    #: The list was redrawn (the number of active alerts may have changed).
    changed = Signal()

    def __init__(self, session: Session, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.session = session
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["Severity", "Kind", "Since step", "Growth", "Alert"])
        self.tree.setRootIsDecorated(False)
        self.tree.setAlternatingRowColors(True)
        self.tree.header().setSectionResizeMode(4, QHeaderView.Stretch)
        self.tree.currentItemChanged.connect(self._show_details)
        self.tree.itemDoubleClicked.connect(lambda *_: self._jump())
        self.details = QLabel("No alert. torchmem watches memory at every step boundary.")
        self.details.setWordWrap(True)
        self.details.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.jump_button = QPushButton("Show culprits in Tensors")
        self.jump_button.setToolTip("Filter the Tensors panel to the tensors behind this alert")
        self.jump_button.clicked.connect(self._jump)
        self.mute_button = QPushButton("Mute this alert")
        self.mute_button.setToolTip("Stop reporting this alert (this signature) in this session")
        self.mute_button.clicked.connect(self._mute)
        buttons = QHBoxLayout()
        buttons.addWidget(self.jump_button)
        buttons.addWidget(self.mute_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(self.tree, 2)
        layout.addWidget(self.details, 1)
        layout.addLayout(buttons)
        self._alerts: list[Alert] = []
        self._update_buttons()

    @property
    def active_count(self) -> int:
        """Alerts whose condition lasts."""
        return sum(1 for a in self._alerts if a.state == "active")

    def bind(self, bridge: SessionBridge) -> None:
        """Redraw whenever an alert is raised, updated or resolved."""
        bridge.when((Alert,), self.refresh)

    @Slot()
    def refresh(self) -> None:
        """Show the Session's alerts, newest first."""
        current = self.tree.currentItem()
        key = current.data(0, Qt.UserRole) if current else None
        self._alerts = self.session.alert_list()  # muted ones never reach it
        self.tree.clear()
        for alert in self._alerts:
            growth = f"{format_bytes(alert.per_step, signed=True)}/step" if alert.per_step else ""
            item = QTreeWidgetItem(
                [
                    alert.severity if alert.state is AlertState.ACTIVE else "resolved",
                    alert.kind.replace("_", " "),
                    str(alert.first_step),
                    growth,
                    alert.said,
                ]
            )
            color = QColor(
                SEVERITY_COLORS.get(alert.severity, "#7f7f7f")
                if alert.state is AlertState.ACTIVE
                else RESOLVED_COLOR
            )
            item.setForeground(0, QBrush(color))
            item.setData(0, Qt.UserRole, alert.session_key)
            item.setToolTip(4, f"{alert.said}\n\nFix: {alert.suggestion}")
            self.tree.addTopLevelItem(item)
            if alert.session_key == key:
                self.tree.setCurrentItem(item)
        if self.tree.currentItem() is None and self.tree.topLevelItemCount():
            self.tree.setCurrentItem(self.tree.topLevelItem(0))
        self._update_buttons()
        self.changed.emit()

    def selected(self) -> Alert | None:
        """The alert selected in the list."""
        item = self.tree.currentItem()
        if item is None:
            return None
        key = item.data(0, Qt.UserRole)
        return next((a for a in self._alerts if a.session_key == key), None)

    def _show_details(self, *_: object) -> None:
        alert = self.selected()
        if alert is None:
            self.details.setText("No alert. torchmem watches memory at every step boundary.")
        else:
            rate = (
                f"<br>{format_bytes(alert.per_step, signed=True)} per step, "
                f"{format_bytes(alert.per_minute, signed=True)} per minute"
                if alert.per_step
                else ""
            )
            self.details.setText(
                f"<b>{alert.kind.replace('_', ' ')}</b> ({alert.severity}, {alert.state}), "
                f"first seen at step {alert.first_step}, raised at step {alert.raised_step}"
                f"{rate}<br>{alert.said}<br><b>Fix:</b> {alert.suggestion}"
            )
        self._update_buttons()

    def _update_buttons(self) -> None:
        alert = self.selected()
        self.jump_button.setEnabled(bool(alert and culprit_filter(alert)))
        self.mute_button.setEnabled(alert is not None)

    def _jump(self) -> None:
        alert = self.selected()
        if alert is not None and culprit_filter(alert):
            self.show_tensors.emit(culprit_filter(alert))

    def _mute(self) -> None:
        alert = self.selected()
        if alert is not None:
            self.mute_requested.emit(alert.session_key)
