"""A tool's result as text: text joined, other content named by its kind, an error result and a non-result each a
failure with the reason."""

from mcp import types

from app.mcp.results import DONE, FAILED, ToolOutcome, outcome_of


def result(*content, is_error=False) -> types.CallToolResult:
    return types.CallToolResult(content=list(content), is_error=is_error)


def test_text_is_joined_and_other_content_described():
    link = types.ResourceLink(type="resource_link", name="notes", uri="file:///notes.txt")
    embedded = types.EmbeddedResource(type="resource", resource=types.TextResourceContents(
        uri="file:///a.txt", text="inside"))
    blob = types.EmbeddedResource(type="resource", resource=types.BlobResourceContents(
        uri="file:///b.bin", blob="AAAA"))
    audio = types.AudioContent(type="audio", data="AAAA", mime_type="audio/wav")
    outcome = outcome_of(result(types.TextContent(type="text", text="one"), link, embedded, blob, audio))
    assert outcome == ToolOutcome(DONE, "one\n[resource: file:///notes.txt]\ninside\n[resource: file:///b.bin]\n"
                                        "[audio: audio/wav]")


def test_an_error_result_is_a_failure_with_its_text():
    outcome = outcome_of(result(types.TextContent(type="text", text="no such file"), is_error=True))
    assert outcome == ToolOutcome(FAILED, "the tool reported an error: no such file")
    assert outcome_of(result(is_error=True)) == ToolOutcome(FAILED, "the tool reported an error: no details")


def test_something_that_is_not_a_result_is_a_failure():
    assert outcome_of(None) == ToolOutcome(
        FAILED, "the server answered with something that is not a tool result (NoneType)")
    assert outcome_of(result()) == ToolOutcome(DONE, "")
