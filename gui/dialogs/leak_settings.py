"""The leak-detection settings dialog, and loading them from QSettings."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QSpinBox,
    QWidget,
)

from torchmem.leaks.detector import LeakSettings

MiB = 1 << 20


def load_leak_settings(settings: QSettings) -> LeakSettings:
    """The detector's settings as saved, defaults where nothing was saved."""
    d = LeakSettings()

    def get(name: str, default: float, kind: type) -> float:
        try:
            return kind(settings.value(f"leaks/{name}", default))
        except (TypeError, ValueError):
            return default

    return replace(
        d,
        warmup_steps=int(get("warmup_steps", d.warmup_steps, int)),
        min_steps=int(get("min_steps", d.min_steps, int)),
        abs_per_step=get("mib_per_step", d.abs_per_step / MiB, float) * MiB,
        capacity_warning=get("capacity_warning", d.capacity_warning, float),
        capacity_critical=get("capacity_critical", d.capacity_critical, float),
    )


class LeakSettingsDialog(QDialog):
    """Warm-up, growth threshold, sustain length and capacity thresholds."""

    def __init__(
        self, current: LeakSettings, settings: QSettings, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Leak detection settings")
        self.settings = settings
        self.current = current
        self.warmup = QSpinBox()
        self.warmup.setRange(0, 10_000)
        self.warmup.setValue(current.warmup_steps)
        self.warmup.setToolTip("Steps ignored at the start (optimizer state, caches filling)")
        self.mib = QDoubleSpinBox()
        self.mib.setRange(0.01, 100_000)
        self.mib.setDecimals(2)
        self.mib.setSuffix(" MiB/step")
        self.mib.setValue(current.abs_per_step / MiB)
        self.mib.setToolTip(
            "Smallest growth per step that counts as a leak (process RSS must grow "
            "1.5 times this: the C heap creeps in healthy runs)"
        )
        self.sustain = QSpinBox()
        self.sustain.setRange(4, 10_000)
        self.sustain.setSuffix(" steps")
        self.sustain.setValue(current.min_steps)
        self.sustain.setToolTip("Growth must last at least this many steps")
        self.warning = QSpinBox()
        self.warning.setRange(10, 100)
        self.warning.setSuffix(" %")
        self.warning.setValue(round(current.capacity_warning * 100))
        self.critical = QSpinBox()
        self.critical.setRange(10, 100)
        self.critical.setSuffix(" %")
        self.critical.setValue(round(current.capacity_critical * 100))
        form = QFormLayout(self)
        form.addRow("Warm-up:", self.warmup)
        form.addRow("Leak threshold:", self.mib)
        form.addRow("Sustained for:", self.sustain)
        form.addRow("Capacity warning at:", self.warning)
        form.addRow("Capacity critical at:", self.critical)
        buttons = QDialogButtonBox(
            QDialogButtonBox.Ok | QDialogButtonBox.Cancel | QDialogButtonBox.RestoreDefaults
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.RestoreDefaults).clicked.connect(self._defaults)
        form.addRow(buttons)

    def _defaults(self) -> None:
        d = LeakSettings()
        self.warmup.setValue(d.warmup_steps)
        self.mib.setValue(d.abs_per_step / MiB)
        self.sustain.setValue(d.min_steps)
        self.warning.setValue(round(d.capacity_warning * 100))
        self.critical.setValue(round(d.capacity_critical * 100))

    def result_settings(self) -> LeakSettings:
        """The settings chosen (also saved to QSettings)."""
        chosen = replace(
            self.current,
            warmup_steps=self.warmup.value(),
            abs_per_step=self.mib.value() * MiB,
            min_steps=self.sustain.value(),
            capacity_warning=self.warning.value() / 100,
            capacity_critical=max(self.critical.value(), self.warning.value()) / 100,
        )
        s = self.settings
        s.setValue("leaks/warmup_steps", chosen.warmup_steps)
        s.setValue("leaks/mib_per_step", chosen.abs_per_step / MiB)
        s.setValue("leaks/min_steps", chosen.min_steps)
        s.setValue("leaks/capacity_warning", chosen.capacity_warning)
        s.setValue("leaks/capacity_critical", chosen.capacity_critical)
        return chosen
