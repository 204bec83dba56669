"""What the window's views show, held once: the process of a job, the x axis, the unit, the
followed window, follow and pause.

Before this model the window pushed each choice into each view by hand (the rank filter into
four of them), and a view added later missed one. Now the toolbar and menus write here and
every view binds to the fields it cares about (``bind_view_state``), as napari's views
bind to its evented models. Changing a field to the value it has emits nothing, so a view
that writes back (the plot turning Follow off when the user pans) makes no loop.
"""

from __future__ import annotations

import contextlib

from PySide6.QtCore import QObject, QSettings, Signal, Slot

X_MODES = ("time", "steps")
UNIT_CHOICES = ("auto", "B", "KiB", "MiB", "GiB")
#: How much of the run Follow keeps in view: label and seconds (None: the whole run).
WINDOWS: tuple[tuple[str, float | None], ...] = (
    ("30 s", 30.0),
    ("2 min", 120.0),
    ("10 min", 600.0),
    ("1 h", 3600.0),
    ("All", None),
)
DEFAULT_WINDOW = "2 min"


class ViewState(QObject):
    """The view choices every view of the window shares; each field has a signal."""

    scope_changed = Signal(object)  # str | None: "rank1", "total", "@node1"; None: all
    x_mode_changed = Signal(str)
    unit_changed = Signal(str)
    window_changed = Signal(str)  # a label of WINDOWS
    follow_changed = Signal(bool)
    paused_changed = Signal(bool)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.scope: str | None = None
        self.x_mode = "time"
        self.unit = "auto"
        self.window = DEFAULT_WINDOW
        self.follow = True
        self.paused = False

    @property
    def window_s(self) -> float | None:
        """The followed window in seconds (None: the whole run)."""
        return dict(WINDOWS)[self.window]

    def set_scope(self, scope: str | None) -> None:
        """Show one process of a job (or a machine's or the job's total); None: all."""
        if scope != self.scope:
            self.scope = scope
            self.scope_changed.emit(scope)

    def set_x_mode(self, mode: str) -> None:
        """``"time"`` (seconds since the run started) or ``"steps"``."""
        if mode not in X_MODES:
            raise ValueError(f"x mode {mode!r}: one of {', '.join(X_MODES)}")
        if mode != self.x_mode:
            self.x_mode = mode
            self.x_mode_changed.emit(mode)

    def set_unit(self, unit: str) -> None:
        """``"auto"`` or B, KiB, MiB, GiB for the memory axes."""
        if unit not in UNIT_CHOICES:
            raise ValueError(f"unit {unit!r}: one of {', '.join(UNIT_CHOICES)}")
        if unit != self.unit:
            self.unit = unit
            self.unit_changed.emit(unit)

    def set_window(self, label: str) -> None:
        """How much of the run Follow keeps in view: a label of :data:`WINDOWS`."""
        if label not in dict(WINDOWS):
            raise ValueError(f"window {label!r}: one of {', '.join(dict(WINDOWS))}")
        if label != self.window:
            self.window = label
            self.window_changed.emit(label)

    @Slot(bool)
    def set_steps(self, steps: bool) -> None:
        """The x axis in steps (True) or in time: what View > X axis in steps says."""
        self.set_x_mode("steps" if steps else "time")

    @Slot(bool)
    def set_follow(self, follow: bool) -> None:
        """Keep the newest data in view (off once the user pans or zooms)."""
        if follow != self.follow:
            self.follow = follow
            self.follow_changed.emit(follow)

    @Slot(bool)
    def set_paused(self, paused: bool) -> None:
        """Freeze the picture; the run goes on being recorded."""
        if paused != self.paused:
            self.paused = paused
            self.paused_changed.emit(paused)

    def restore(self, settings: QSettings) -> None:
        """The x axis, unit and window of the last session (a bad stored value is left
        at its default: a hand-edited file never stops the window from opening)."""
        for key, setter in (
            ("view/x_mode", self.set_x_mode),
            ("view/unit", self.set_unit),
            ("view/window", self.set_window),
        ):
            value = settings.value(key)
            if value is not None:
                with contextlib.suppress(ValueError):
                    setter(str(value))

    def save(self, settings: QSettings) -> None:
        """Remember the choices that outlive a session (not scope, follow or pause)."""
        settings.setValue("view/x_mode", self.x_mode)
        settings.setValue("view/unit", self.unit)
        settings.setValue("view/window", self.window)
