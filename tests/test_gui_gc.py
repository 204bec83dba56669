"""While a window is open, cyclic garbage is collected in the GUI thread only.

A collection in the script's thread or the command thread could destroy a Qt object
there, and PySide6 deadlocks doing that (it hung a CI run at the gc.collect button).
"""

from __future__ import annotations

import gc
import threading

from PySide6.QtCore import QCoreApplication, QEvent

from torchmem.gui.gui_gc import GuiThreadCollector


def settle() -> None:
    """Delete the widgets of earlier tests now: their deallocations lower CPython's
    allocation counter, so freed later they would hide this test's garbage from the
    counter that decides when a collection is due."""
    QCoreApplication.sendPostedEvents(None, QEvent.DeferredDelete)
    gc.collect()


class Cycle:
    """Cyclic garbage that records the thread it was destroyed in."""

    def __init__(self, where: list[int]) -> None:
        self.me = self
        self.where = where

    def __del__(self) -> None:
        self.where.append(threading.get_ident())


def test_garbage_made_in_another_thread_is_collected_in_the_gui_thread(qtbot, make_window):
    make_window()
    settle()
    assert not gc.isenabled()
    where: list[int] = []

    def churn() -> None:
        # Enough allocations to pass generation 0's threshold many times over: with
        # automatic collection on, this thread would collect the cycles itself.
        for _ in range(5000):
            Cycle(where)

    worker = threading.Thread(target=churn)
    worker.start()
    worker.join()
    qtbot.waitUntil(lambda: len(where) == 5000, timeout=5000)
    assert set(where) == {threading.main_thread().ident}


def test_closing_the_last_window_gives_collection_back(qtbot, make_window):
    first, second = make_window(), make_window()
    first.close()
    assert not gc.isenabled(), "one window is still open"
    second.close()
    assert gc.isenabled()
    assert not GuiThreadCollector.active()


def test_a_script_that_turned_collection_off_is_honoured(qtbot, make_window):
    collector = make_window()._collector
    settle()
    old = gc.get_threshold()
    where: list[int] = []
    gc.set_threshold(0)
    try:
        for _ in range(3000):
            Cycle(where)
        collector.collect_due()  # a tick
        assert where == []
    finally:
        gc.set_threshold(*old)
    qtbot.waitUntil(lambda: len(where) == 3000, timeout=5000)


def test_the_gc_button_collects_in_the_gui_thread(qtbot, make_window, script_path):
    window = make_window()
    window.load_script(script_path("train_steps.py"), ["2"], run=True)
    qtbot.waitUntil(lambda: window.last_result is not None and not window.running, timeout=60000)
    where: list[int] = []
    old = gc.get_threshold()
    gc.set_threshold(0)  # keep the timer from taking the cycle first
    try:
        Cycle(where)
        window.act_gc.trigger()
        qtbot.waitUntil(lambda: window.statusBar().currentMessage().startswith("gc.collect:"))
    finally:
        gc.set_threshold(*old)
    assert where == [threading.main_thread().ident]
