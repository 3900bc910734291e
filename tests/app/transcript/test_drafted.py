"""The highlight of drafted words: marking never changes what the Markdown means, only prose words are marked,
and each marked run becomes one span with nothing but text inside."""

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from app.theme import DRAFTED
from app.transcript import drafted
from app.transcript.markdown import CodeSegment, MarkdownRenderer

MARKDOWN_ALPHABET = "ab xy 12.*_#`-=+\n|[]()>~:/!\t"


@st.composite
def text_and_spans(draw):
    text = draw(st.text(alphabet=MARKDOWN_ALPHABET, max_size=80))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    spans = [(a, b) for a, b in zip(cuts[::2], cuts[1::2], strict=False) if a < b]
    return text, spans


@given(text_and_spans())
@settings(max_examples=400, deadline=None)
def test_marking_changes_no_markdown_and_every_run_is_a_span_around_text_alone(case):
    text, spans = case
    marked = drafted.mark(text, spans)
    assert drafted.strip(marked) == text
    renderer = MarkdownRenderer()
    plain = renderer.segments(text)
    pieces = renderer.segments(marked)
    opening = f'<span style="background-color:{DRAFTED[0]};">'
    unmarked = [re.sub(f"{re.escape(opening)}([^<]*)</span>", r"\1", p) if isinstance(p, str) else p
                for p in pieces]
    assert unmarked == plain  # the same page once the highlight's spans are taken out
    for piece in pieces:
        if isinstance(piece, str):
            assert drafted.START not in piece and drafted.END not in piece


def test_only_prose_words_are_marked_never_a_line_start_or_syntax():
    text = "1. one two\n**bold** and `code x`\n```py\nx = 1\n```\n"
    marked = drafted.mark(text, [(0, len(text))])
    S, E = drafted.START, drafted.END
    assert marked.startswith(f"1. {S}one two{E}\n**{S}bold{E}** {S}and{E} `{S}code x{E}`\n```")
    pieces = MarkdownRenderer().segments(marked)
    code = next(p for p in pieces if isinstance(p, CodeSegment))
    assert (code.language, code.code) == ("py", "x = 1\n")  # a code block is shown and copied unmarked
    assert f'<span style="background-color:{DRAFTED[0]};">one two</span>' in pieces[0]


def test_spans_past_the_text_or_overlapping_are_clipped():
    S, E = drafted.START, drafted.END
    assert drafted.mark("hello world", [(0, 5), (3, 50)]) == f"{S}hello{E} {S}world{E}"
    marked = drafted.mark("hello world", [(6, 50)])
    assert marked == f"hello {S}world{E}"
    assert drafted.mark("", [(0, 3)]) == ""
