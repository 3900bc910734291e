"""Shared fixtures for the conversation view's tests."""

import pytest

from app.transcript.view import ChatView


@pytest.fixture
def view(qtbot):
    """A conversation view, shown offscreen at 700 x 500."""
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(700, 500)
    view.show()
    return view
