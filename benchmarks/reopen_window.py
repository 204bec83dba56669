"""Reopening a long recorded run in the window: time to the first drawn frame, memory.

Writes a run of ``--hours`` at 10 Hz into a session file (as record_overhead.py does, 6
series, 10 steps a second, a census every 5 minutes, a log line a second), then opens it in
a window (offscreen) and measures the time from File > Recorded sessions > Open to the
traces' first redraw, and what the window process's RSS grew by.

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/reopen_window.py [--hours 24]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import platform
import tempfile
import time
from pathlib import Path

import psutil
import record_overhead
import report
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

from torchmem.gui.windows.main_window import MainWindow
from torchmem.units import format_bytes


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hours", type=float, default=24.0)
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="torchmem-reopen-"))
    os.environ["TORCHMEM_SESSIONS_DIR"] = str(folder)
    with contextlib.redirect_stdout(io.StringIO()):
        record_overhead.an_hour_on_disk(folder, args.hours)
    path = folder / "hour.tmsession"
    app = QApplication.instance() or QApplication([])
    window = MainWindow(settings=QSettings(str(folder / "settings.ini"), QSettings.IniFormat))
    window.resize(1400, 900)
    window.show()
    app.processEvents()
    rss_before = psutil.Process().memory_info().rss
    started = time.perf_counter()
    assert window.recordings.open(str(path))
    window.plot.refresh(force=True)  # the bridge's next tick would do this within 33 ms
    app.processEvents()
    first_frame = time.perf_counter() - started
    rss_after = psutil.Process().memory_info().rss
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Qt offscreen"
    )
    keys = window.session.keys()
    points = sum(len(window.session.arrays(k)[0]) for k in keys)
    print(
        f"{args.hours:g} h at 10 Hz ({window.session.samples:,} samples, "
        f"{path.stat().st_size / 1e6:.1f} MB file): first drawn frame {first_frame:.2f} s "
        f"after Open; {points:,} points drawn; window RSS +{format_bytes(rss_after - rss_before)}"
        ""
    )
    report.row(
        f"reopen a {args.hours:g} h recording: first drawn frame",
        f"{first_frame:.2f} s",
        "<= 1 s" if args.hours >= 24 * 7 else "",
        first_frame <= 1.0 if args.hours >= 24 * 7 else None,
        f"{window.session.samples:,} samples at 10 Hz, offscreen window, "
        f"+{format_bytes(rss_after - rss_before)} RSS",
    )
    window.close()


if __name__ == "__main__":
    main()
