"""Cost and speed of the agent: step time with a viewer attached, latency, many agents.

1. Step time of one CPU training loop in this process, in interleaved blocks: unmonitored,
   torchmem's defaults without an agent, and the same plus the agent with a viewer (a
   separate process) subscribed at 10 Hz. Ratios to the unmonitored loop.
2. Sample-to-GUI latency: a served script in a child process, this process as the viewer
   with the window's 30 Hz bridge; the delay from a sample's reading in the child to the
   bridge handing it to the views (p50 / p99).
3. 16 agents at 10 Hz (16 served processes under one launcher) into one window attached
   to the launcher: the window process's CPU use.

    QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/agent_overhead.py
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import report
import torch
from sampler_overhead import Monitored, make_loop, timed_block

from torchmem.agent import Agent
from torchmem.sources.processes import agents_for
from torchmem.transport.discovery import find_agent

HERE = Path(__file__).resolve().parent
SERVED = HERE.parent / "tests" / "scripts" / "served_train.py"

VIEWER = """
import os, sys, time
from torchmem.sources.processes import agents_for
from torchmem.sources.remote import RemoteSource
from torchmem.session import Session
parent = int(sys.argv[1])
while True:
    try:
        os.kill(parent, 0)
    except OSError:
        break
    for entry in agents_for(parent):
        if entry.label == "no-viewer":
            continue
        remote = RemoteSource(Session(), entry)
        try:
            remote.connect()
        except Exception:
            continue
        remote.ended.wait()
        remote.close()
    time.sleep(0.02)
"""

FLEET = """
import subprocess, sys, time
children = [subprocess.Popen([sys.executable, sys.argv[1], "--sleep", "0.05"],
                             stdout=subprocess.DEVNULL) for _ in range(int(sys.argv[2]))]
try:
    for c in children:
        c.wait()
finally:
    for c in children:
        c.kill()
"""


def torchmem_cpu() -> float:
    """CPU seconds used so far by this process's torchmem threads (sampler, agent)."""
    ids = {t.native_id for t in threading.enumerate() if t.name.startswith("torchmem")}
    return sum(t.user_time + t.system_time for t in psutil.Process().threads() if t.id in ids)


class Measured(Monitored):
    """:class:`Monitored`, also counting the CPU its own threads use while timed: the
    share of a core torchmem takes from the machine, which the noise of step times on a
    small VM hides."""

    def __init__(self, hz: float) -> None:
        super().__init__(hz)
        self.cpu_s = 0.0
        self.wall_s = 0.0

    def timed(self, step, steps: int) -> list[float]:
        before = torchmem_cpu()
        times = super().timed(step, steps)
        self.cpu_s += torchmem_cpu() - before
        self.wall_s += sum(times)
        return times


class WithAgent(Measured):
    """torchmem's defaults plus the agent, with a viewer subscribed before timing starts
    (``viewer=False``: the agent alone, published but never attached)."""

    def __init__(self, hz: float, viewer: psutil.Process | None = None) -> None:
        super().__init__(hz)
        self.viewer = viewer
        self.viewer_cpu_s = 0.0

    def block(self, step, steps: int) -> list[float]:
        agent = Agent(self.source, label="" if self.viewer else "no-viewer")
        agent.start()
        try:
            if self.viewer is None:
                return super().block(step, steps)
            if not agent.first_viewer.wait(30):
                raise RuntimeError("the viewer process never subscribed")
            before = self.viewer.cpu_times()
            times = super().block(step, steps)
            after = self.viewer.cpu_times()
            self.viewer_cpu_s += after.user + after.system - before.user - before.system
            return times
        finally:
            agent.close(linger_s=0)


def step_time(blocks: int, steps: int) -> None:
    viewer = subprocess.Popen([sys.executable, "-c", VIEWER, str(os.getpid())])
    try:
        step = make_loop()
        for _ in range(10):
            step()
        variants = {
            "unmonitored": None,
            "defaults, no agent": Measured(10.0),
            "agent, no viewer": WithAgent(10.0),
            "agent + viewer": WithAgent(10.0, viewer=psutil.Process(viewer.pid)),
        }
        names = list(variants)
        results: dict[str, list[float]] = {name: [] for name in variants}
        rounds: list[dict[str, float]] = []  # each round's median step per variant
        for r in range(blocks):
            # The order turns round by round, so that no variant always follows another
            # (an agent's teardown, a warm cache) and slow drifts hit every variant alike.
            medians = {}
            for name in names[r % len(names) :] + names[: r % len(names)]:
                monitor = variants[name]
                times = timed_block(step, steps) if monitor is None else monitor.block(step, steps)
                results[name] += times
                medians[name] = statistics.median(times)
            rounds.append(medians)
        viewed = variants["agent + viewer"]
        viewer_share = viewed.viewer_cpu_s / viewed.wall_s
    finally:
        viewer.kill()
        viewer.wait()
    base = statistics.median(results["unmonitored"])
    base_mean = statistics.fmean(results["unmonitored"])
    print(f"\n1. step time ({blocks} rounds x {steps} steps, interleaved, order rotated)")
    print(
        f"{'variant':<20} {'median':>10} {'ratio':>7} {'mean':>10} {'ratio':>7}"
        f"   {'paired ratio: median [quartiles]':>34}   {'torchmem threads':>16}"
    )
    for name, times in results.items():
        med, mean = statistics.median(times), statistics.fmean(times)
        # Each round's block against the unmonitored block of the same round: what the
        # variant costs, with the machine's slow drifts taken out.
        paired = sorted(m[name] / m["unmonitored"] for m in rounds)
        monitor = variants[name]
        cpu = f"{monitor.cpu_s / monitor.wall_s:.2%} of a core" if monitor else "-"
        q1, q2, q3 = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
        print(
            f"{name:<20} {med * 1e3:>7.2f} ms {med / base:>7.3f} {mean * 1e3:>7.2f} ms "
            f"{mean / base_mean:>7.3f}   {q2:>16.3f} [{q1:.3f}, {q3:.3f}]   {cpu:>16}"
        )
    print(
        f"the viewer process (a RemoteSource, no window), while subscribed and timed: "
        f"{viewer_share:.2%} of a core"
    )
    paired = statistics.median(m["agent + viewer"] / m["unmonitored"] for m in rounds)
    report.ratio_row(
        "step time, agent + connected viewer",
        paired,
        1.01,
        f"paired median of {blocks} rotated rounds x {steps} steps, viewer in a process",
    )


def _qt_app():
    from torchmem.gui.app import create_app

    return create_app()


def delays_of(session: Any, seconds: float) -> list[float]:
    """Reading-to-bridge delays of the periodic samples arriving in ``session`` for
    ``seconds`` (the event loop runs meanwhile): what the window's views see."""
    from PySide6.QtCore import QEventLoop, QTimer

    from torchmem.events import Sample
    from torchmem.gui.bridge import SessionBridge

    bridge = SessionBridge(session)
    since = session.now() + 1.0  # past the replay of the history
    delays: list[float] = []
    pending: list[float] = []
    lock = threading.Lock()

    def arrived(event: object) -> None:  # in the connection's reader thread
        # Periodic samples only: step-boundary readings are batched on purpose (taken
        # in the training loop, handed on at the sampler's next tick).
        if isinstance(event, Sample) and event.step is None and event.t > since:
            with lock:
                pending.append(event.t)

    def drawn() -> None:  # the bridge's 30 Hz tick told the views: the sample is shown
        now = session.now()
        with lock:
            delays.extend(now - t for t in pending)
            pending.clear()

    unsubscribe = session.subscribe(arrived)
    bridge.changed.connect(drawn)
    loop = QEventLoop()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    loop.exec()
    unsubscribe()
    bridge.close()
    return sorted(delays)


def latency(seconds: float) -> None:
    from torchmem.session import Session
    from torchmem.sources.remote import RemoteSource

    _qt_app()
    proc = subprocess.Popen([sys.executable, str(SERVED), "--sleep", "0.02"],
                            stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        entry = None
        while entry is None:
            entry = find_agent(proc.pid)
            time.sleep(0.05)
        session = Session()
        remote = RemoteSource(session, entry)
        remote.connect()
        delays = delays_of(session, seconds)
        remote.close()
    finally:
        proc.kill()
        proc.wait()
    p50 = delays[len(delays) // 2]
    p99 = delays[int(len(delays) * 0.99)]
    print(
        f"\n2. sample-to-GUI latency (reading in the agent's process to the window's views) "
        f"over {len(delays)} samples ({seconds:g} s at 10 Hz)"
    )
    print(f"p50 {p50 * 1e3:.1f} ms, p99 {p99 * 1e3:.1f} ms, max {delays[-1] * 1e3:.1f} ms")
    how = f"{len(delays)} samples at 10 Hz, agent in a child, to the window's 30 Hz bridge"
    report.row("sample-to-plot latency p50 (local socket)", f"{p50 * 1e3:.1f} ms", "", None, how)
    report.row(
        "sample-to-plot latency p99 (local socket)",
        f"{p99 * 1e3:.1f} ms", "<= 50 ms", p99 <= 0.050, how,
    )  # fmt: skip


def spin(seconds: float) -> None:
    """Run the event loop for a while (app.quit() would close the window: Qt 6)."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    loop.exec()


def fleet(n: int, seconds: float) -> None:
    from PySide6.QtCore import QSettings

    from torchmem.gui.windows.main_window import MainWindow
    from torchmem.session import Session
    from torchmem.sources.inprocess import InProcessSource

    _qt_app()
    launcher = subprocess.Popen([sys.executable, "-c", FLEET, str(SERVED), str(n)])
    try:
        deadline = time.monotonic() + 180
        while len(agents_for(launcher.pid)) < n and time.monotonic() < deadline:
            time.sleep(0.2)
        agents = len(agents_for(launcher.pid))
        settings = QSettings(tempfile.mktemp(suffix=".ini"), QSettings.IniFormat)
        window = MainWindow(InProcessSource(Session()), settings)
        window.show()
        window.attach(launcher.pid)
        spin(5.0)  # connect and replay first
        me = psutil.Process()
        cpu0, t0 = sum(me.cpu_times()[:2]), time.monotonic()
        samples0 = window.session.samples
        spin(seconds)
        cpu = sum(me.cpu_times()[:2]) - cpu0
        elapsed = time.monotonic() - t0
        samples = window.session.samples - samples0
        attached = window.attached.label if window.attached else window.run_label.text()
        problem = window.banner.text() if window.banner.isVisible() else ""
        window.close()
    finally:
        children = psutil.Process(launcher.pid).children(recursive=True)
        launcher.kill()
        launcher.wait()
        for child in children:  # the served processes would outlive their launcher
            child.kill()
    print(f"\n3. {agents} agents at 10 Hz into one window, over {elapsed:.0f} s: {attached}")
    if problem:
        print(f"   banner: {problem}")
    print(
        f"window process CPU: {100 * cpu / elapsed:.1f}% of one core; "
        f"{samples / elapsed:.0f} samples/s received (ranks and their total)"
    )
    report.row(
        f"{agents} agents x 10 Hz into one window: its CPU",
        f"{100 * cpu / elapsed:.1f}% of a core", "", None,
        f"{elapsed:.0f} s, offscreen window attached to their launcher",
    )  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--blocks", type=int, default=8)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1)")
    p.add_argument("--agents", type=int, default=16)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--parts", default="123", help="which parts to run (default: 123)")
    args = p.parse_args()
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    os.environ.setdefault("TORCHMEM_RUNTIME_DIR", tempfile.mkdtemp(prefix="tm-bench-"))
    torch.set_num_threads(args.threads)
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"torch {torch.__version__}, {torch.get_num_threads()} torch thread(s)"
    )
    if "1" in args.parts:
        step_time(args.blocks, args.steps)
    if "2" in args.parts:
        latency(args.seconds)
    if "3" in args.parts:
        fleet(args.agents, args.seconds)


if __name__ == "__main__":
    main()
