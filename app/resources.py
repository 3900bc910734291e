"""The app's shipped files (presets, icons), found through importlib.resources: the same lookup in a checkout,
an installed wheel and a PyInstaller bundle."""

from __future__ import annotations

from importlib.resources import as_file, files
from importlib.resources.abc import Traversable
from pathlib import Path

ICON_SIZES = (16, 22, 24, 32, 48, 64, 128, 256, 512)
APP_ID = "io.github.kvasir.Kvasir"  # the desktop entry and AppStream id (assets/<APP_ID>.desktop)


def asset(name: str) -> Traversable:
    """A file in ``app/assets`` (``"presets.json"``, ``"icons/kvasir.svg"``); FileNotFoundError if missing."""
    found = files("app.assets").joinpath(*name.split("/"))
    if not found.is_file():
        raise FileNotFoundError(f"{name} is missing from this installation's app/assets")
    return found


def icon_file(size: int) -> Path:
    """The PNG of the app icon at ``size`` pixels, as a file path (for Qt)."""
    with as_file(asset(f"icons/hicolor/{size}x{size}/apps/kvasir.png")) as path:
        return Path(path)  # package data is on disk in all three layouts, so the path stays valid


def app_icon():
    """The window icon, every hicolor size (QIcon picks the one that fits)."""
    from PySide6.QtGui import QIcon

    icon = QIcon()
    for size in ICON_SIZES:
        icon.addFile(str(icon_file(size)))
    return icon
