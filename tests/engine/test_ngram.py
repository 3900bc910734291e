"""Prompt lookup: the continuation of the latest earlier occurrence of the last few tokens, longest match first,
from the sequence itself and then from recent finished ones; the index grown token by token is the index of the
whole list."""

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.serving.ngram import MAX_NGRAM, RECENT_SEQUENCES, NgramIndex, NgramProposer


def test_the_continuation_of_the_latest_occurrence_longest_match_first():
    proposer = NgramProposer()
    #          0  1  2  3  4  5  6  7  8  9 10 11
    tokens = [1, 2, 3, 4, 9, 9, 2, 3, 5, 6, 1, 2, 3]
    # suffix (1, 2, 3) occurred at 0..2 followed by 4, 9, 9; (2, 3) last occurred at 6..7 followed by 5, 6
    assert proposer.propose("a", tokens, 3) == [4, 9, 9]
    assert proposer.propose("b", [7, 2, 3, 5, 6, 8, 2, 3], 2) == [5, 6]


def test_no_match_no_draft_and_the_last_ngram_is_never_its_own_match():
    proposer = NgramProposer()
    assert proposer.propose("a", [1, 2, 3, 4, 5], 4) == []
    assert proposer.propose("a", [1, 2, 3, 4, 5], 0) == []


def test_a_match_running_into_the_end_gives_way_to_the_one_before():
    proposer = NgramProposer()
    # (7, 7) occurs at 0..1 (then 1, 2, 3, 4) and at 5..6 (then only 7)
    tokens = [7, 7, 1, 2, 3, 7, 7, 7]
    assert proposer.propose("a", tokens, 4) == [1, 2, 3, 7]


def test_growing_the_list_extends_the_index():
    proposer = NgramProposer()
    tokens = [5, 6, 7]
    assert proposer.propose("a", tokens, 2) == []
    tokens += [8, 5, 6]  # the same list object, grown as a reply grows
    assert proposer.propose("a", tokens, 2) == [7, 8]


def test_recent_finished_sequences_lend_their_text():
    proposer = NgramProposer()
    proposer.propose("old", [10, 11, 12, 13, 14], 1)
    proposer.finish("old")
    assert proposer.propose("new", [0, 11, 12], 3) == [13, 14]
    for i in range(RECENT_SEQUENCES):
        proposer.propose(f"other{i}", [100 + i, 101 + i], 1)
        proposer.finish(f"other{i}")
    assert proposer.propose("newer", [0, 11, 12], 3) == []  # "old" has been pushed out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=60), st.lists(st.integers(1, 10), max_size=8))
def test_the_index_grown_in_steps_is_the_index_built_at_once(tokens, steps):
    grown, whole = NgramIndex(), NgramIndex()
    whole.extend(tokens)
    cut = 0
    for step in steps:
        cut = min(len(tokens), cut + step)
        grown.extend(tokens[:cut])
    grown.extend(tokens)
    assert grown._next == whole._next
    for n in range(2, MAX_NGRAM + 1):
        if len(tokens) > n:
            suffix = tuple(tokens[-n:])
            starts = [i for i in range(len(tokens) - n) if tuple(tokens[i : i + n]) == suffix]
            expected = tokens[starts[-1] + n : starts[-1] + n + 3] if starts else []
            got = whole.continuation(suffix, 3)
            assert got == expected or (len(expected) < 3 and len(got) > len(expected))
