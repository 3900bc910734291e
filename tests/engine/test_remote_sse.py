"""The event-stream decoder: events end at a blank line, data lines join, comments and unknown fields are
ignored, an event left open at the end is still read."""

from engine.remote.sse import SSEDecoder, SSEEvent


def feed(lines):
    decoder, events = SSEDecoder(), []
    for line in lines:
        event = decoder.feed(line)
        if event is not None:
            events.append(event)
    return events, decoder


def test_each_blank_line_ends_one_event():
    events, _ = feed(['data: {"a": 1}', "", 'data: {"b": 2}', ""])
    assert events == [SSEEvent("message", '{"a": 1}'), SSEEvent("message", '{"b": 2}')]


def test_data_lines_of_one_event_join_with_newlines_and_one_leading_space_goes():
    events, _ = feed(["data: first", "data:second", "data:  third", ""])
    assert events == [SSEEvent("message", "first\nsecond\n third")]


def test_comments_unknown_fields_and_stray_blank_lines_are_ignored():
    events, _ = feed([": keep-alive", "", "id: 7", "retry: 100", "data: x", "", "", ""])
    assert events == [SSEEvent("message", "x")]


def test_named_events_keep_their_type_and_it_does_not_leak_into_the_next():
    events, _ = feed(["event: error", 'data: {"error": "oom"}', "", "data: y", ""])
    assert events == [SSEEvent("error", '{"error": "oom"}'), SSEEvent("message", "y")]


def test_carriage_returns_left_on_a_line_do_not_reach_the_data():
    events, _ = feed(["data: [DONE]\r", "\r"])
    assert events == [SSEEvent("message", "[DONE]")]


def test_an_event_without_its_closing_blank_line_is_returned_by_flush():
    events, decoder = feed(["data: last"])
    assert events == [] and decoder.flush() == SSEEvent("message", "last") and decoder.flush() is None
