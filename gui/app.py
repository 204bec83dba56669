"""Start the torchmem window: ``torchmem [OPTIONS] [SCRIPT [ARGS...]]``."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

from PySide6.QtCore import QSettings, QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from torchmem.resources import demo_script
from torchmem.resources import path as resource_path
from torchmem.session import Session
from torchmem.sources.inprocess import InProcessSource

from .main_window import MainWindow
from .theme import apply_theme


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


def main(opts: argparse.Namespace) -> int:
    """Open the window, run the script (or the demo) if given, and return the exit code."""
    app = create_app()
    apply_theme(app, str(QSettings().value("view/theme", "system")))
    source = InProcessSource(Session(), hz=opts.hz, lazy=True)
    window = MainWindow(source)
    window.show()
    script = str(demo_script()) if opts.demo else opts.script
    if getattr(opts, "isolated", False):
        window.act_isolated.setChecked(True)
    if getattr(opts, "attach_entry", None):
        from torchmem.cli.attach import entry_from_file
        from torchmem.transport.client import AttachError

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
    if getattr(opts, "snapshot", None):
        window.snapshots.open(opts.snapshot)
    if opts.screenshot:
        screenshot_when_drawn(window, opts.screenshot, opts.screenshot_after)
    # Ctrl+C in the terminal closes the window cleanly instead of being ignored by Qt.
    signal.signal(signal.SIGINT, lambda *_: window.close())
    keepalive = QTimer()
    keepalive.timeout.connect(lambda: None)  # lets Python see the signal while Qt runs
    keepalive.start(250)
    code = app.exec()
    if window.force_exit_needed:
        sys.stderr.flush()
        os._exit(code)
    return code
