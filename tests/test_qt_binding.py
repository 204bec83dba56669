"""The Qt binding itself must survive a long session: signals must not leak references.

PySide6 6.12.0 on Python 3.11 drops a reference to a bool on every Python-side emit; after
a few hundred redraws the interpreter aborts ("bool_dealloc"). pyproject.toml excludes it;
this test catches a binding with the same fault before users do.
"""

from __future__ import annotations

import gc
import sys

from PySide6.QtCore import QObject, Signal


class _Emitter(QObject):
    plain = Signal()
    payload = Signal(list)


def test_emitting_signals_keeps_refcounts_of_singletons(qtbot):
    emitter = _Emitter()
    received = []
    emitter.plain.connect(lambda: received.append(1))
    emitter.payload.connect(received.append)
    # Garbage freed meanwhile (by a collection) would drop references too: none during
    # the measurement, so that only the emits can change the counts.
    gc.collect()
    gc.disable()
    try:
        before = {
            name: sys.getrefcount(obj)
            for name, obj in (("True", True), ("False", False), ("None", None))
        }
        for _ in range(300):  # fewer than the ~600 that crash the faulty binding
            emitter.plain.emit()
            emitter.payload.emit([1])
        after = {
            name: sys.getrefcount(obj)
            for name, obj in (("True", True), ("False", False), ("None", None))
        }
    finally:
        gc.enable()
    assert len(received) == 600
    for name in before:
        assert after[name] >= before[name] - 20, (
            f"emits leak references to {name}: {before} -> {after}"
        )
