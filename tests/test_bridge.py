"""The bridge between the Session (any thread) and the views (the GUI thread)."""

from __future__ import annotations

import threading

from torchmem.events import LogRecord, Sample, Stream
from torchmem.gui.bridge import SessionBridge
from torchmem.session import Session


def test_events_from_another_thread_arrive_in_order_on_the_gui_thread(qtbot):
    session = Session()
    bridge = SessionBridge(session)
    got: list = []
    threads: list = []
    bridge.events.connect(
        lambda events: (got.extend(events), threads.append(threading.get_ident()))
    )

    def produce():
        for i in range(200):
            session.submit(Sample(i * 0.01, {"cpu/rss": float(i)}))
            if i % 20 == 0:
                session.submit(LogRecord(i * 0.01, Stream.STDOUT, f"line {i}"))

    worker = threading.Thread(target=produce)
    worker.start()
    worker.join()
    qtbot.waitUntil(lambda: len(got) == 10, timeout=2000)
    # Samples are never queued as events (the traces read the Session), logs keep order.
    assert [e.text for e in got] == [f"line {i}" for i in range(0, 200, 20)]
    assert set(threads) == {threading.get_ident()}
    bridge.close()


def test_redraws_are_throttled_however_fast_samples_arrive(qtbot):
    session = Session()
    bridge = SessionBridge(session)
    with qtbot.waitSignal(bridge.changed, timeout=2000):
        for i in range(5000):
            session.submit(Sample(i * 1e-4, {"cpu/rss": float(i)}))
    bridge.flush()
    redraws = bridge.redraws
    assert redraws <= 3  # 5000 samples, a handful of redraws at most
    bridge.flush()
    assert bridge.redraws == redraws  # nothing new: no redraw
    late: list = []
    bridge.events.connect(late.extend)
    bridge.close()
    session.submit(LogRecord(1.0, Stream.STDOUT, "after close"))
    bridge.flush()
    assert late == []  # closed: it no longer listens to the Session


def test_script_output_alone_redraws_no_trace(qtbot):
    """A printing script: its lines reach the Log pane as events, and the traces (which
    did not change) are not redrawn for them at the bridge's full rate."""
    session = Session()
    bridge = SessionBridge(session)
    lines: list = []
    bridge.events.connect(lines.extend)
    session.submit(Sample(0.0, {"cpu/rss": 1.0}))
    bridge.flush()
    drawn = bridge.redraws
    for i in range(50):
        session.submit(LogRecord(i * 0.01, Stream.STDOUT, f"line {i}\n"))
        bridge.flush()
    assert len(lines) == 50 and bridge.redraws == drawn
    session.submit(Sample(1.0, {"cpu/rss": 2.0}))
    bridge.flush()
    assert bridge.redraws == drawn + 1
    bridge.close()
