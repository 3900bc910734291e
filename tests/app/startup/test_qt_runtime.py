"""The Qt binding itself: signal emission must not leak or drop references (PySide6 6.12.0 did)."""

import sys

from PySide6.QtCore import QObject, Signal


class Emitter(QObject):
    changed = Signal(int, int, str)


def test_emitting_signals_keeps_reference_counts_steady():
    emitter = Emitter()
    received = []
    emitter.changed.connect(lambda a, b, text: received.append(a))
    before = sys.getrefcount(True), sys.getrefcount(False), sys.getrefcount(None)
    for i in range(20_000):
        emitter.changed.emit(i, 0, "delta")
    after = sys.getrefcount(True), sys.getrefcount(False), sys.getrefcount(None)
    assert len(received) == 20_000
    assert all(abs(a - b) < 100 for a, b in zip(after, before))
