"""The window's memory over a long run: a simulated week of 10 Hz samples, fed live.

A window (offscreen) is fed what a week-long training run sends it, as fast as it takes
it: every tenth of a second a sample of 6 series and a step marker, a log line every 10
seconds, a progress bar redrawn every second (a carriage return, as tqdm does), an
epoch marker every hour, a census of 200 storages every 5 minutes. The Qt event loop
runs once per ``--every`` simulated minutes (10: a week is 1,008 frames), so the bridge
drains and the views redraw as they would. The process's RSS is read at the end of
every simulated day (after a collection). Targets: <= 300 MiB at the end, and
flat over the last days (the Session, its series and every view are bounded by design;
this is where a leak would show).

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/gui_week.py [--days 7] [--hz 10]
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import tempfile
import time
from pathlib import Path

import psutil
import report
from PySide6.QtCore import QEvent, QSettings
from PySide6.QtWidgets import QApplication

from torchmem.events import CensusTaken, LogRecord, Marker, MarkerKind, Sample, Stream
from torchmem.gui.windows.main_window import MainWindow
from torchmem.tensors.model import Census, StorageInfo, TensorInfo
from torchmem.units import format_bytes

KEYS = ("cpu/rss", "cpu/uss", "system/available", "cpu/tensors", "cuda:0/allocated",
        "cuda:0/reserved")  # fmt: skip
MIB = 1 << 20
#: The end-of-run RSS target and how much the last days may add to it.
TARGET_MIB = 300
FLAT_MIB = 10


def census(step: int, storages: int = 200) -> Census:
    """A census of ``storages`` parameters and gradients whose sizes drift with ``step``."""
    out: dict[tuple[str, int], StorageInfo] = {}
    for i in range(storages):
        key = ("cpu", 0x10000 + i * 4096)
        n = 1024 + (step + i) % 64
        kind = "parameter" if i % 2 else "gradient"
        info = TensorInfo(
            name=f"model.layers.{i // 2}.weight" + ("" if i % 2 else ".grad"), kind=kind,
            shape=(n,), stride=(1,), storage_offset=0, dtype="float32", device="cpu",
            numel=n, element_size=4, span_bytes=4 * n, is_view=False, is_contiguous=True,
            requires_grad=True, is_leaf=True, grad_fn="", pinned=False, storage_key=key,
        )  # fmt: skip
        out[key] = StorageInfo(key, 4 * n, [info])
    return Census(out, [], 0.05, step)


def feed_day(window: MainWindow, app: QApplication, day: int, hz: float, every: int) -> None:
    """One simulated day of a run into the window's Session."""
    session = window.session
    submit = session.submit
    per_minute = int(60 * hz)
    dt = 1.0 / hz
    step = int(day * 86400 * hz)
    for minute in range(24 * 60):
        t0 = (day * 1440 + minute) * 60.0
        for i in range(per_minute):
            t = t0 + i * dt
            wave = (step % 500) * 4096.0
            submit(Sample(t, {k: (j + 1) * 1e9 + wave for j, k in enumerate(KEYS)}, step))
            submit(Marker(t, MarkerKind.STEP, step=step))
            step += 1
            if i % max(1, int(hz)) == 0:  # a progress bar redrawn every second, as tqdm
                bar = f"\r{step % 1000 / 10:5.1f}%|{'#' * (step % 1000 // 50):<20}| {step}"
                submit(LogRecord(t, Stream.STDERR, bar))
            if i % max(1, int(10 * hz)) == 0:
                submit(LogRecord(t, Stream.STDOUT, f"step {step} loss {1 / (1 + step):.6f}\n"))
        if minute % 60 == 0:
            submit(Marker(t0, MarkerKind.EPOCH, f"epoch {day * 24 + minute // 60}", step))
        if minute % 5 == 0:
            submit(CensusTaken(t0, step, census(step), "step"))
        if minute % every == every - 1:
            frame(app)


def frame(app: QApplication) -> None:
    """Run the event loop once, as between two frames of the running app, deleting what
    views handed to ``deleteLater`` (``processEvents`` alone leaves those for the outer
    loop, which a benchmark that feeds and draws in turn never returns to)."""
    app.processEvents()
    app.sendPostedEvents(None, QEvent.DeferredDelete)


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--days", type=int, default=7)
    p.add_argument("--hz", type=float, default=10.0)
    p.add_argument("--every", type=int, default=10, help="simulated minutes between frames")
    args = p.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    folder = Path(tempfile.mkdtemp(prefix="torchmem-week-"))
    os.environ["TORCHMEM_SESSIONS_DIR"] = str(folder)
    app = QApplication.instance() or QApplication([])
    window = MainWindow(settings=QSettings(str(folder / "settings.ini"), QSettings.IniFormat))
    window.resize(1400, 900)
    window.show()
    app.processEvents()
    start_rss = rss()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Qt offscreen")
    print(f"window before the run: {format_bytes(start_rss)}")
    daily: list[int] = []
    started = time.perf_counter()
    for day in range(args.days):
        feed_day(window, app, day, args.hz, max(1, args.every))
        window.plot.refresh(force=True)
        frame(app)
        daily.append(rss())
        print(
            f"day {day + 1}: {window.session.samples:,} samples, RSS {format_bytes(daily[-1])} "
            f"({time.perf_counter() - started:.0f} s)"
        )
    end = daily[-1]
    tail = daily[-min(3, len(daily)) :]
    growth = tail[-1] - tail[0]
    samples = window.session.samples
    how = (
        f"{samples:,} samples at {args.hz:g} Hz over {args.days} simulated days, 6 series, a "
        f"step marker each, censuses every 5 min; a frame every {args.every} min; offscreen"
    )
    report.row(
        f"window RSS after a simulated week ({args.hz:g} Hz)", format_bytes(end),
        f"<= {TARGET_MIB} MiB", end <= TARGET_MIB * MIB, how,
    )  # fmt: skip
    report.row(
        f"window RSS growth over the last {len(tail) - 1} days", format_bytes(growth),
        f"<= {FLAT_MIB} MiB", growth <= FLAT_MIB * MIB,
        "the Session, its series and the views are bounded: a leak would show here",
    )  # fmt: skip
    window.close()


if __name__ == "__main__":
    main()
