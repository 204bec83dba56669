"""A script that floods its output: time to run it plain, under ``torchmem run``, and in
the window (offscreen), side by side.

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/log_flood.py [--lines 300000]

The window's Log pane keeps the last 20,000 lines; the terminal (and a recorded session)
get every line.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import report
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication

SCRIPT = """
import sys
for i in range({lines}):
    print(f"line {{i}}: loss 0.{{i % 1000:03d}} lr 0.001 grad-norm 1.234")
"""


def timed(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def in_window(script: Path, folder: Path) -> tuple[float, int]:
    from torchmem.gui.main_window import MainWindow

    app = QApplication.instance() or QApplication([])
    window = MainWindow(settings=QSettings(str(folder / "settings.ini"), QSettings.IniFormat))
    window.show()
    app.processEvents()
    started = time.perf_counter()
    window.load_script(str(script), [], run=True)
    while window.session.run_finished is None or window.running:
        app.processEvents()
        time.sleep(0.001)
    window.bridge.flush()
    app.processEvents()
    window.log.flush()
    took = time.perf_counter() - started
    lines = window.log.document().blockCount()
    window.close()
    app.processEvents()
    return took, lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=300_000)
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="torchmem-flood-"))
    os.environ["TORCHMEM_SESSIONS_DIR"] = str(folder / "sessions")
    script = folder / "flood.py"
    script.write_text(SCRIPT.format(lines=args.lines))
    plain = timed([sys.executable, str(script)])
    headless = timed([sys.executable, "-m", "torchmem", "run", "--quiet", str(script)])
    window, shown = in_window(script, folder)
    print(f"machine: {platform.node()} · {os.cpu_count()} CPUs · Qt offscreen")
    print(f"{args.lines:,} lines printed; the Log pane shows the last {shown:,}\n")
    print(f"{'run':<28} {'time':>8}  {'ratio to torchmem run':>22}")
    for name, value in (("plain python", plain), ("torchmem run", headless),
                        ("the window", window)):  # fmt: skip
        print(f"{name:<28} {value:>7.2f}s  {value / headless:>21.2f}x")
    print("target: the window <= 1.2x torchmem run")
    report.ratio_row(
        "log flood: the window / torchmem run",
        window / headless,
        1.2,
        f"{args.lines:,} printed lines, each run once (plain python {plain:.2f} s)",
    )


if __name__ == "__main__":
    main()
