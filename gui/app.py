"""Start the torchmem window: ``torchmem [OPTIONS] [SCRIPT [ARGS...]]``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from PySide6.QtCore import QObject, QSettings, QTimer, Signal, Slot
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication, QMessageBox, QWidget

from torchmem.gui.theme import apply_theme
from torchmem.gui.windows.main_window import MainWindow
from torchmem.gui.windows.snapshot_window import SnapshotOpener
from torchmem.resources import demo_script
from torchmem.resources import path as resource_path
from torchmem.session import Session
from torchmem.sources.inprocess import InProcessSource


def create_app() -> QApplication:
    """The QApplication, created once, with torchmem's names (used by QSettings)."""
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("torchmem")
    app.setOrganizationName("torchmem")
    app.setWindowIcon(QIcon(str(resource_path("icon.svg"))))
    return app


def screenshot_when_drawn(window: MainWindow, path: str, samples: int) -> None:
    """Save a screenshot once ``samples`` samples are drawn, then close the window.

    Under a real X server the picture comes from the screen (``grabWindow``), so it shows
    what a user would see; offscreen it falls back to rendering the widget.
    """

    def check() -> None:
        if window.plot.samples_drawn < samples:
            return
        timer.stop()
        # Unix time, for a benchmark to subtract its own start from (a process's
        # create_time can be off by half a second from time.time() in a container).
        # To the terminal, not the Log pane: sys.stderr is the running script's meanwhile.
        print(f"torchmem: first samples drawn at {time.time():.3f}", file=sys.__stderr__)
        # An attached run replays its history in one burst: let the views settle (ranges,
        # tables, the log) for a second before the picture is taken.
        QTimer.singleShot(1000, grab)

    def grab() -> None:
        screen = window.screen()
        image = screen.grabWindow(window.winId()) if screen else None
        if image is None or image.isNull():
            image = window.grab()
        ok = image.save(path)
        print(
            f"torchmem: screenshot {'saved to' if ok else 'FAILED for'} {path} "
            f"after {window.plot.samples_drawn} samples",
            file=sys.__stderr__,
        )
        window.close()

    timer = QTimer(window)
    timer.setInterval(20)
    timer.timeout.connect(check)
    timer.start()


class SnapshotAlone(QObject):
    """``torchmem snapshot FILE``: the Snapshot window alone, no main window behind it.

    The reading's progress dialog needs a parent: a hidden widget. A cancelled reading
    is :attr:`done` with 0; a failed one says its reason on the terminal and in a message
    box (:attr:`failure_box`), and is done with 1 once the box is closed. Closing the
    Snapshot window ends the application as its last window."""

    #: The exit code the application should end with.
    done = Signal(int)

    def __init__(self, path: str) -> None:
        super().__init__()
        self.host = QWidget()
        self.opener = SnapshotOpener(self.host)
        self.failure_box: QMessageBox | None = None
        self.opener.failed.connect(self._on_failed)
        self.opener.ended.connect(self._on_ended)
        self.opener.open(path)

    @Slot(str)
    def _on_failed(self, text: str) -> None:
        print(f"torchmem: {text}", file=sys.__stderr__)
        box = QMessageBox(QMessageBox.Critical, "torchmem: cannot open the snapshot", text)
        box.finished.connect(lambda _: self.done.emit(1))
        self.failure_box = box

    @Slot(bool)
    def _on_ended(self, opened: bool) -> None:
        if opened:
            return
        if self.failure_box is not None:
            self.failure_box.show()
        else:
            self.done.emit(0)  # cancelled


def main(opts: argparse.Namespace) -> int:
    """Open the window, run the script (or the demo) if given, and return the exit code."""
    app = create_app()
    apply_theme(app, str(QSettings().value("view/theme", "system")))
    if getattr(opts, "snapshot", None):
        alone = SnapshotAlone(opts.snapshot)
        alone.done.connect(app.exit)
        code = app.exec()
        alone.opener.shutdown()
        return code
    source = InProcessSource(Session(), hz=opts.hz, lazy=True)
    window = MainWindow(source)
    window.show()
    script = str(demo_script()) if opts.demo else opts.script
    if getattr(opts, "isolated", False):
        window.act_isolated.setChecked(True)
    if getattr(opts, "attach_entry", None):
        from torchmem.transport.client import AttachError, entry_from_file

        try:
            entry = entry_from_file(opts.attach_entry, opts.address)
            window.attach(entry.pid, [entry])
        except AttachError as exc:
            window.show_error(str(exc))
    elif getattr(opts, "hosts", None):
        window.attach(opts.attach, hosts=opts.hosts)
    elif getattr(opts, "attach", None) is not None:
        window.attach(opts.attach)
    elif script:
        if getattr(opts, "record", None):
            window.recordings.recorder.next_path = Path(opts.record).expanduser().resolve()
        window.load_script(script, list(opts.args), run=True, cwd=opts.cwd)
    if opts.screenshot:
        screenshot_when_drawn(window, opts.screenshot, opts.screenshot_after)
    # Ctrl+C in the terminal closes the window cleanly instead of being ignored by Qt;
    # so does `kill PID` (a logout, a scheduler's end): the run is stopped and its
    # recording ends with it, where SIGTERM's default left it read as a crash.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: window.close())
    keepalive = QTimer()
    keepalive.timeout.connect(lambda: None)  # lets Python see the signal while Qt runs
    keepalive.start(250)
    code = app.exec()
    if window.force_exit_needed:
        sys.stderr.flush()
        os._exit(code)
    return code
