"""Kvasir's version: pyproject.toml's, read from the installed package metadata (or the checkout's pyproject)."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

DISTRIBUTION = "kvasir"
_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def read_version() -> str:
    """The checkout's pyproject version when running from a source tree, else the installed metadata's."""
    if _PYPROJECT.is_file():  # a checkout: its own pyproject wins over whatever copy is installed
        match = re.search(r'(?m)^version\s*=\s*"([^"]+)"', _PYPROJECT.read_text(encoding="utf-8"))
        if match:
            return match.group(1)
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


__version__ = read_version()
