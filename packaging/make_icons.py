"""Render app/assets/icons/kvasir.svg to the hicolor PNG sizes with Qt (no other tool needed).

Run after changing the SVG: ``python packaging/make_icons.py``; the PNGs are committed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ICONS = Path(__file__).resolve().parent.parent / "app" / "assets" / "icons"


def render(svg: Path, size: int, target: Path) -> None:
    """Draw ``svg`` onto a transparent ``size``x``size`` image and save it as PNG."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QImage, QPainter
    from PySide6.QtSvg import QSvgRenderer

    image = QImage(size, size, QImage.Format_ARGB32_Premultiplied)
    image.fill(Qt.transparent)
    painter = QPainter(image)
    painter.setRenderHint(QPainter.Antialiasing)
    QSvgRenderer(str(svg)).render(painter)
    painter.end()
    target.parent.mkdir(parents=True, exist_ok=True)
    if not image.save(str(target), "PNG"):
        raise OSError(f"could not write {target}")


def main() -> int:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtGui import QGuiApplication

    sys.path.insert(0, str(ICONS.parents[2]))
    from app.resources import ICON_SIZES

    app = QGuiApplication.instance() or QGuiApplication(sys.argv[:1])  # noqa: F841  (QImage fonts need one)
    for size in ICON_SIZES:
        render(ICONS / "kvasir.svg", size, ICONS / "hicolor" / f"{size}x{size}" / "apps" / "kvasir.png")
    print(f"wrote {len(ICON_SIZES)} PNGs under {ICONS / 'hicolor'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
