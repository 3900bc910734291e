"""A reply's text split into reasoning and answer as it streams: markers cut anywhere between chunks, parts that
only grow, and what a block the prompt opened or a reply cut short leaves."""

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.serving.reply_channels import ReplyChannels
from engine.templates.reasoning import FAMILIES, opened_by, reasoning_support, split_reasoning

THINK, MAGISTRAL = FAMILIES


def stream(text, markers, opened, cuts):
    """Feed ``text`` a prefix at a time (ending at each of ``cuts``), then whole and final; the deltas joined."""
    channels = ReplyChannels(markers, opened)
    answer, reasoning = "", ""
    for end in sorted(set(cuts)):
        new_answer, new_reasoning, _ = channels.update(text[:end], final=False)
        answer, reasoning = answer + new_answer, reasoning + new_reasoning
        assert channels.answer == answer and channels.reasoning == reasoning
    new_answer, new_reasoning, _ = channels.update(text, final=True)
    return answer + new_answer, reasoning + new_reasoning, channels


def test_a_block_that_opens_the_reply_is_its_reasoning():
    split = split_reasoning("<think>\nLet me see.\n</think>\n\nParis.", THINK, opened=False, final=True)
    assert (split.reasoning, split.answer, split.thinking) == ("Let me see.", "Paris.", False)
    assert split.answer_start == len("<think>\nLet me see.\n</think>\n\n")


def test_a_block_the_prompt_opened_starts_the_reply_thinking():
    assert split_reasoning("Hmm, 2 + 2", THINK, opened=True, final=False).reasoning == "Hmm, 2 + 2"
    split = split_reasoning("Hmm.</think>4", THINK, opened=True, final=True)
    assert (split.reasoning, split.answer) == ("Hmm.", "4")


def test_markers_later_in_the_answer_are_its_text_and_no_markers_means_all_answer():
    text = "Use <think> tags like <think>this</think>."
    assert split_reasoning(text, THINK, opened=False, final=True).answer == text
    assert split_reasoning(text, None, opened=False, final=False).answer == text


def test_what_may_become_a_marker_is_held_back_until_it_is_known():
    assert split_reasoning("  <thi", THINK, opened=False, final=False).answer == ""
    assert split_reasoning("  <thi", THINK, opened=False, final=True).answer == "  <thi"
    assert split_reasoning("step one </thi", THINK, opened=True, final=False).reasoning == "step one"
    assert split_reasoning("a < b", THINK, opened=True, final=False).reasoning == "a < b"


def test_a_reply_cut_short_while_thinking_is_all_reasoning():
    split = split_reasoning("<think>first, the sum of", THINK, opened=False, final=True)
    assert (split.reasoning, split.answer, split.thinking) == ("first, the sum of", "", True)


def test_magistral_markers_and_draft_spans_of_the_answer():
    text = "[THINK]plan[/THINK] Answer here."
    channels = ReplyChannels(MAGISTRAL, opened=False)
    channels.update(text, final=True)
    assert (channels.reasoning, channels.answer) == ("plan", "Answer here.")
    start = text.index("Answer")
    assert channels.answer_spans([(0, 4), (start - 3, start + 6), (start + 7, len(text) + 5)]) == ((0, 6), (7, 12))


PIECES = st.sampled_from(["<think>", "</think>", "<", "/", "think", ">", " ", "\n", "ab", "é", "[THINK]",
                          "2 < 3", "</thin", "x"])


@settings(max_examples=400, deadline=None)
@given(st.lists(PIECES, max_size=14), st.lists(PIECES, max_size=14), st.booleans(), st.booleans(),
       st.lists(st.integers(0, 200), max_size=12), st.sampled_from(FAMILIES))
def test_streamed_parts_equal_the_whole_texts_split_wherever_it_is_cut(before, after, opened, closes, cuts, markers):
    reasoning = "".join(before).replace(markers.end, "")
    answer = "".join(after)
    opening = "" if opened else markers.start
    text = opening + reasoning + (markers.end + answer if closes else "")
    streamed_answer, streamed_reasoning, _ = stream(text, markers, opened, [c for c in cuts if c <= len(text)])
    whole = split_reasoning(text, markers, opened, final=True)
    assert (streamed_answer, streamed_reasoning) == (whole.answer, whole.reasoning)
    if markers.end not in reasoning:
        assert whole.reasoning == reasoning.strip()
        assert whole.answer == (answer.lstrip() if closes else "")


def test_the_prompt_tail_says_whether_a_block_is_open():
    assert opened_by("<|im_start|>assistant\n<think>\n", THINK)
    assert not opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n", THINK)
    assert not opened_by("<|im_start|>assistant\n", THINK)


def test_the_family_is_recognised_from_the_template_or_the_vocabulary():
    assert reasoning_support("{{ '</think>' }}{% if enable_thinking %}{% endif %}", {}).markers == THINK
    assert reasoning_support("{{ '</think>' }}", {}).can_turn_off is False
    assert reasoning_support("plain", {"<think>": 1, "</think>": 2}).markers == THINK
    assert reasoning_support("{{ '[/THINK]' }}", {}).markers == MAGISTRAL
    assert reasoning_support("plain", {"hello": 1}).markers is None
    harmony = reasoning_support("<|start|>assistant<|channel|>analysis", {})
    assert harmony.markers is None and "harmony" in harmony.note
