"""The window's recorded sessions: each run recorded, the Sessions dialog, a recording shown
again in the window's views, runs compared, the shown run exported.

A part of the window rather than a view: it acts on the window's Session (replaying a file
into it), its banner and labels, so it holds the window; the window builds one and routes
the File and Run menu actions here.
"""

from __future__ import annotations

import contextlib
import csv
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, QRect, QSettings, QSize, Qt, Slot
from PySide6.QtGui import QPainter
from PySide6.QtSvg import QSvgGenerator
from PySide6.QtWidgets import QApplication, QFileDialog, QWidget

from torchmem.gui.dialogs.census_diff_dialog import CensusDiffDialog
from torchmem.gui.dialogs.sessions_dialog import SessionsDialog
from torchmem.gui.windows.compare_window import CompareWindow
from torchmem.leaks.oom import explain_oom
from torchmem.record.census_diff import recorded_censuses
from torchmem.record.library import DEFAULT_CAP_BYTES
from torchmem.record.replay import load
from torchmem.record.runs import RunRecorder
from torchmem.record.store import RecordError, SessionFile
from torchmem.report.recorded import export_csv, recorded_summary
from torchmem.report.summary import run_summary, write_summary
from torchmem.session import Session

if TYPE_CHECKING:
    from torchmem.gui.windows.main_window import MainWindow

#: File dialog filters of File > Export the run, by suffix.
EXPORT_FILTERS = (
    "CSV: every sample, a column per trace (*.csv)",
    "PNG image of the traces (*.png)",
    "SVG image of the traces (*.svg)",
    "JSON run summary (*.json)",
)


class Recordings(QObject):
    """Recording, reopening, comparing and exporting runs, for one window."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        #: Each run of the window's Session, written to the sessions folder as it happens.
        self.recorder = RunRecorder(
            window.session,
            summarize=lambda session: self.summary(session),
            on_problem=window.session.note,
        )
        #: The session file shown, when the window shows a recording (not a run of its own).
        self.opened: Path | None = None

    # -- settings ------------------------------------------------------------------------
    def restore(self, settings: QSettings) -> None:
        """Recording on or off, and the folder's size cap (GiB), as last set."""
        enabled = settings.value("record/enabled", True) not in (False, "false")
        self.window.act_record.setChecked(enabled)
        self.recorder.enabled = enabled
        cap_gib = settings.value("record/cap_gib", DEFAULT_CAP_BYTES / 1024**3)
        # A hand-edited setting that is not a number keeps the default.
        with contextlib.suppress(TypeError, ValueError):
            self.recorder.cap_bytes = max(1, int(float(cap_gib) * 1024**3))

    @Slot(bool)
    def toggle(self, checked: bool) -> None:
        """Run > Record every run."""
        self.recorder.enabled = checked
        self.window.settings.setValue("record/enabled", checked)
        self.window.statusBar().showMessage(
            "Runs are recorded from the next one on" if checked else "Runs are not recorded",
            5000,
        )

    def close(self) -> None:
        """Close the file being written (the window is closing)."""
        self.recorder.close()

    def summary(self, session: Session) -> dict:
        """The summary a recording stores and File > Export writes."""
        data = run_summary(session)
        oom = explain_oom(session)
        if oom is not None:
            data["oom"] = oom.to_json()
        return data

    # -- the Sessions dialog ---------------------------------------------------------------
    @Slot()
    def open_dialog(self) -> None:
        """File > Recorded sessions: recorded runs to open, compare, rename or delete."""
        dialog = SessionsDialog(self.window)
        dialog.open_requested.connect(self.open)
        dialog.compare_requested.connect(self.compare)
        dialog.exec()
        dialog.deleteLater()  # destroyed by this thread's event loop, never by a gc elsewhere

    @Slot(str)
    def open(self, path: str) -> bool:
        """Show a recorded session in the window's views, as it was when recorded."""
        w = self.window
        if w.running or w.attached is not None:
            w.show_error(
                "A run is in progress: stop it (Shift+F5) or detach before opening a recording.",
                "info",
            )
            return False
        try:
            SessionFile(path).close()  # a file that cannot be read leaves the views as they are
        except RecordError as exc:
            w.show_error(f"Cannot open the recording: {exc}")
            return False
        w.banner.hide()
        w.clear_views()
        was_recording, self.recorder.enabled = self.recorder.enabled, False
        try:
            recording = load(path, w.session)
        except RecordError as exc:
            w.show_error(f"Cannot open the recording: {exc}")
            return False
        finally:
            self.recorder.enabled = was_recording
        self.opened = Path(path)
        w.bridge.flush()
        meta = recording.meta
        name = meta.get("title") or Path(str(meta.get("script") or path)).name
        created = str(meta.get("created", ""))[:19].replace("T", " ")
        w.setWindowTitle(f"{name} (recorded {created}) – torchmem")
        ended = recorded_summary(recording)["message"]
        # A detach ends the recording, not the process: no end to report, and no crash.
        detached = bool(meta.get("detached")) and recording.ended is None
        if recording.ended is None:
            w.run_label.setText("Detached" if detached else "Recording interrupted")
            w.run_label.setToolTip(ended)
        w.window_combo.setCurrentIndex(w.window_combo.findData(None))
        w.statusBar().showMessage(
            f"Opened the recording of {name} ({created}): {w.session.samples:,} samples, "
            f"{w.session.steps.steps:,} steps",
            15000,
        )
        if recording.problems:
            w.show_error(f"{Path(path).name}: " + "; ".join(recording.problems), "warning")
        elif recording.ended is None and not detached:
            w.banner.show_message(f"{name}: {ended}", "warning")
        w.update_actions()
        return True

    @Slot(list)
    def compare(self, paths: list[str]) -> CompareWindow | None:
        """Open a Compare window on two or more recorded sessions."""
        recordings = []
        QApplication.setOverrideCursor(Qt.WaitCursor)
        try:
            for path in paths:
                recordings.append(load(path))
        except RecordError as exc:
            self.window.show_error(f"Cannot compare: {exc}")
            return None
        finally:
            QApplication.restoreOverrideCursor()
        window = CompareWindow(recordings, self.window)
        window.setAttribute(Qt.WA_DeleteOnClose)
        window.show()
        return window

    @Slot()
    def compare_censuses(self) -> CensusDiffDialog | None:
        """Memory > Compare two censuses: any two of the shown run's censuses, by name."""
        w = self.window
        source = self.shown_file()
        try:
            taken = recorded_censuses(source) if source is not None else []
        except RecordError as exc:
            w.show_error(f"Cannot read the censuses: {exc}")
            return None
        if len(taken) < 2:
            w.show_error(
                "Two censuses are needed: take them with Memory > Take a census (Ctrl+Shift+C) "
                "at the points to compare, or leave automatic censuses on"
                + ("" if source is not None else ", with Run > Record every run on"),
                "info",
            )
            return None
        dialog = CensusDiffDialog(taken, w)
        dialog.setAttribute(Qt.WA_DeleteOnClose)
        dialog.show()
        return dialog

    # -- exports ---------------------------------------------------------------------------
    def shown_file(self) -> Path | None:
        """The session file of the run the window shows, if there is one."""
        if self.opened is not None:
            return self.opened
        path = self.recorder.last_path
        return path if path is not None and path.exists() else None

    @Slot()
    def export(self) -> None:
        """File > Export the run: the format follows the chosen file's suffix."""
        path, _ = QFileDialog.getSaveFileName(
            self.window, "Export the run", "run.csv", ";;".join(EXPORT_FILTERS)
        )
        if path:
            self.export_to(path)

    def export_to(self, path: str) -> bool:
        """Write the shown run to ``path``: ``.csv`` every sample (from its session file
        when there is one, at full rate), ``.png`` / ``.svg`` the traces, ``.json`` the
        summary. Says what it wrote, or why it could not, in the status bar."""
        w = self.window
        out = Path(path)
        suffix = out.suffix.lower()
        if w.session.samples == 0:
            w.show_error("Nothing to export yet: run a script or open a recording.", "info")
            return False
        try:
            if suffix == ".png":
                if not w.plot.grab().save(str(out)):
                    raise OSError("the image could not be written")
                what = "the traces"
            elif suffix == ".svg":
                _render_svg(w.plot, out)
                what = "the traces"
            elif suffix == ".json":
                if not write_summary(str(out), self.summary(w.session)):
                    raise OSError("see the terminal")
                what = "the summary"
            else:
                source = self.shown_file()
                rows = (
                    export_csv(source, out)
                    if source is not None and not w.running
                    else _session_csv(w.session, out)
                )
                what = f"{rows:,} samples"
        except (OSError, RecordError) as exc:
            w.show_error(f"Cannot export to {out}: {exc}")
            return False
        w.statusBar().showMessage(f"Exported {what} to {out}", 15000)
        return True


def _render_svg(widget: QWidget, out: Path) -> None:
    """The widget as vector graphics. pyqtgraph's SVGExporter cannot parse the path data
    Qt 6 writes (it fails on every trace here), so Qt's own generator draws it."""
    generator = QSvgGenerator()
    generator.setFileName(str(out))
    size = widget.size()
    generator.setSize(QSize(size.width(), size.height()))
    generator.setViewBox(QRect(0, 0, size.width(), size.height()))
    generator.setTitle("torchmem traces")
    painter = QPainter()
    if not painter.begin(generator):
        raise OSError("the SVG file could not be written")
    try:
        widget.render(painter)
    finally:
        painter.end()
    if not out.exists():
        raise OSError("the SVG file could not be written")


def _session_csv(session: Session, out: Path) -> int:
    """Every reading the Session holds (recent ones at full rate, older ones as the min and
    max of their buckets), a column per trace: when no session file has the run."""
    keys = session.keys()
    rows: dict[float, dict[str, float]] = {}
    for key in keys:
        t, v = session.arrays(key)
        for ti, vi in zip(t.tolist(), v.tolist(), strict=True):
            rows.setdefault(round(ti, 4), {})[key] = vi
    with out.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["t_s", *keys])
        for t in sorted(rows):
            writer.writerow([t, *(_cell(rows[t].get(k)) for k in keys)])
    return len(rows)


def _cell(value: float | None) -> str | int | float:
    if value is None:
        return ""
    return int(value) if float(value).is_integer() else value
