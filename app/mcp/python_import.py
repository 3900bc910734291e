"""Importing a library past PySide6's import hook.

Once PySide6 is imported, every ``import`` statement goes through its hook, which reads each newly imported
module's source with :mod:`inspect` to see whether it uses PySide6. :func:`inspect.unwrap` asks the module for
``__wrapped__``; on ``pydantic.errors`` that runs pydantic's lazy ``__getattr__``, which imports
``pydantic._internal._validators`` while that module is itself half imported, and the import fails
("cannot import name 'import_string' from partially initialized module"). The MCP SDK is built on pydantic, so
connecting to a server failed that way now and then. The hook only serves PySide6's ``__feature__`` switches,
which Kvasir does not use."""

from __future__ import annotations

import builtins
import importlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()


@contextmanager
def python_import() -> Iterator[None]:
    """Within the block, ``import`` is Python's own (``importlib.__import__``); the hook is back after it."""
    with _lock:
        hooked = builtins.__import__
        builtins.__import__ = importlib.__import__
        try:
            yield
        finally:
            builtins.__import__ = hooked
