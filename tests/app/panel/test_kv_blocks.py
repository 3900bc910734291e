"""The KV pool as a picture: each chat's blocks in its colour, at any pool size, aggregated when the pool has
more blocks than cells."""

import pytest


def _pixels_of(image, color) -> int:
    target = color.rgb()
    return sum(1 for y in range(image.height()) for x in range(image.width()) if image.pixel(x, y) == target)


@pytest.mark.parametrize("pool", [64, 2_912, 100_000])
def test_the_block_pool_shows_each_chats_blocks_at_any_pool_size(qtbot, pool):
    """30 blocks of one chat, 6 shared and 20 cached stay visible in a pool of 64 to 100,000 blocks."""
    from PySide6.QtGui import QColor

    from app.panel.kv_blocks import COLORS, BlockPoolView

    view = BlockPoolView()
    qtbot.addWidget(view)
    view.resize(270, 90)
    chat = QColor("#3a7bd5")
    view.set_segments([(30, chat, "chat"), (6, COLORS["shared"], "shared"), (20, COLORS["cached"], "cached")],
                      free=pool - 56)
    image = view.grab().toImage()
    assert _pixels_of(image, chat) > 30 * 20  # a cell each, bar included
    assert _pixels_of(image, COLORS["shared"]) > 6 * 20 and _pixels_of(image, COLORS["cached"]) > 20 * 10
    assert view.blocks_per_cell == 1 and view.caption().startswith("1 cell = 1 block")


def test_a_pool_fuller_than_its_cells_aggregates_blocks(qtbot):
    from PySide6.QtGui import QColor

    from app.panel.kv_blocks import BlockPoolView

    view = BlockPoolView()
    qtbot.addWidget(view)
    view.resize(270, 90)
    view.set_segments([(50_000, QColor("#3a7bd5"), "chat"), (100, QColor("#e67e22"), "chat")], free=10)
    assert view.blocks_per_cell > 1 and "1 cell ≈" in view.caption()
    assert _pixels_of(view.grab().toImage(), QColor("#e67e22")) > 20  # the small chat still has its cell
