"""Waiting on a Qt signal while the asyncio loop (qasync) runs, as the app's coroutines need it to."""

from __future__ import annotations

import asyncio


def run_until(qloop, signal, check, timeout: float = 5.0):
    """Run the asyncio loop until ``signal`` fires with arguments for which ``check`` is true; returns them.
    ``timeout`` only guards against a hang: the wait ends on the signal."""
    future = qloop.create_future()

    def seen(*args):
        if not future.done() and check(*args):
            future.set_result(args)

    signal.connect(seen)
    try:
        return qloop.run_until_complete(asyncio.wait_for(future, timeout))
    finally:
        signal.disconnect(seen)
