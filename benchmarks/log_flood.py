"""A script that floods its output: time to run it plain, under ``torchmem run``, and in
the window (offscreen), side by side.

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/log_flood.py [--lines 300000]

The window's Log pane keeps the last 20,000 lines; the terminal (and a recorded session)
get every line. Each round runs, in turn and each in a fresh process, the flood and an
empty script under ``torchmem run`` and in the window: both ways pay the same start-up
(importing torch to find the accelerators), so the empty script's time, taken off, leaves
what the flood itself costs each way. Medians over the rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import report

SCRIPT = """
import sys
for i in range({lines}):
    print(f"line {{i}}: loss 0.{{i % 1000:03d}} lr 0.001 grad-norm 1.234")
"""


def timed(cmd: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def in_window(script: Path, folder: Path) -> tuple[float, int]:
    """Seconds from Run to the run's last line in the Log pane, and the lines it shows."""
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from torchmem.gui.windows.main_window import MainWindow

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


def window_child(script: Path, folder: Path) -> tuple[float, int]:
    """:func:`in_window` in a fresh process (its stdout a pipe, as a terminal's would be
    written to): no torch imported before, as under ``torchmem run``."""
    result = folder / "window.json"
    env = {**os.environ, "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "offscreen")}
    subprocess.run(
        [sys.executable, __file__, "--window-child", str(script), str(result)],
        check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    took, lines = json.loads(result.read_text())
    return took, lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=300_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window-child", nargs=2, metavar=("SCRIPT", "RESULT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.window_child:
        script, result = map(Path, args.window_child)
        Path(result).write_text(json.dumps(in_window(script, result.parent)))
        return
    folder = Path(tempfile.mkdtemp(prefix="torchmem-flood-"))
    os.environ["TORCHMEM_SESSIONS_DIR"] = str(folder / "sessions")
    flood, empty = folder / "flood.py", folder / "empty.py"
    flood.write_text(SCRIPT.format(lines=args.lines))
    empty.write_text("pass\n")
    headless = [sys.executable, "-m", "torchmem", "run", "--quiet"]
    times: dict[str, list[float]] = {k: [] for k in ("plain", "run", "run0", "win", "win0")}
    shown = 0
    for _ in range(args.rounds):
        times["plain"].append(timed([sys.executable, str(flood)]))
        times["run"].append(timed([*headless, str(flood)]))
        times["run0"].append(timed([*headless, str(empty)]))
        took, shown = window_child(flood, folder)
        times["win"].append(took)
        times["win0"].append(window_child(empty, folder)[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    run_flood, win_flood = med["run"] - med["run0"], med["win"] - med["win0"]
    print(f"machine: {platform.node()} · {os.cpu_count()} CPUs · Qt offscreen")
    print(f"{args.lines:,} lines printed; the Log pane shows the last {shown:,}")
    print(f"medians of {args.rounds} rounds, each run in a fresh process\n")
    print(f"{'run':<34} {'time':>8}  {'ratio to torchmem run':>22}")
    for name, value, base in (
        ("plain python", med["plain"], med["run"]),
        ("torchmem run", med["run"], med["run"]),
        ("the window", med["win"], med["run"]),
        ("torchmem run, the flood's part", run_flood, run_flood),
        ("the window, the flood's part", win_flood, run_flood),
    ):
        print(f"{name:<34} {value:>7.2f}s  {value / base:>21.2f}x")
    print("target: the window <= 1.2x torchmem run")
    report.ratio_row(
        "log flood: the window / torchmem run",
        med["win"] / med["run"],
        1.2,
        f"{args.lines:,} printed lines, fresh processes, median of {args.rounds} rounds "
        f"(window {med['win']:.2f} s, torchmem run {med['run']:.2f} s, plain python "
        f"{med['plain']:.2f} s)",
    )
    if run_flood >= 0.25:  # smaller (--quick), the difference of two start-ups is noise
        report.row(
            "log flood, the flood's part: the window / torchmem run",
            f"{win_flood / run_flood:.2f}x",
            how=f"each less an empty script's run the same way ({med['win0']:.2f} s and "
            f"{med['run0']:.2f} s): {win_flood:.2f} s against {run_flood:.2f} s",
        )


if __name__ == "__main__":
    main()
