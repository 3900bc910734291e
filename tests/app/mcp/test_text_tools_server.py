"""The text-tools MCP server that ships with the app (for the screenshots, and to try MCP with), over stdio."""

from __future__ import annotations

import sys

import pytest

from app.data.mcp_servers import McpServer
from app.mcp.results import DONE, FAILED
from app.mcp.toolbox import McpToolbox

pytestmark = pytest.mark.timeout(120)


def test_its_tools_count_letters_and_words_and_refuse_a_letter_that_is_not_one(qloop):
    box = McpToolbox(timeout_s=20)
    qloop.run_until_complete(box.connect([McpServer("text", command=sys.executable,
                                                    args=("-m", "app.tools.text_tools_server"))]))
    try:
        assert sorted(t["function"]["name"] for t in box.tools()) == ["count_letter", "word_count"]
        calls = [box.call("count_letter", '{"word": "Strawberry", "letter": "R"}'),
                 box.call("word_count", '{"text": "the quick  brown fox"}'),
                 box.call("count_letter", '{"word": "banana", "letter": "an"}')]
        counted, words, refused = (qloop.run_until_complete(c) for c in calls)
        assert (counted.status, counted.text) == (DONE, "3")
        assert (words.status, words.text) == (DONE, "4")
        assert refused.status == FAILED and "letter must be one character, not 'an'" in refused.text
    finally:
        qloop.run_until_complete(box.close())
