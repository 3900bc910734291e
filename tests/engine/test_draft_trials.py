"""A batch's trials of the draft model: a few plain steps, then drafted steps judged by their pace against plain
steps', kept while they pay; a first loss tries again soon, a batch as large as one that lost twice in a row
waits long before it tries again, and no batch tries while the draft model is far behind its replies."""

import pytest

from engine.serving.draft_trials import (
    CLOSE_BEHIND,
    FIRST_WAIT,
    KEEP_MARGIN,
    LOSSES_BEFORE_WAIT,
    LOST_WAIT,
    TRIAL_STEPS,
    BatchTrials,
)

PLAIN = 0.01  # seconds a plain step of the batch takes per token


def _plain_steps(trials: BatchTrials, batch: int = 4, behind: int = 0) -> int:
    """Steps until a trial starts (at most a thousand)."""
    for steps in range(1000):
        if trials.drafts(batch, behind):
            return steps
    return 1000


def _drafted(trials: BatchTrials, pace: float, steps: int, batch: int = 4) -> int:
    """Drafted steps at ``pace`` times a plain step's, until ``steps`` or the trials stop drafting: how many ran."""
    for ran in range(1, steps + 1):
        trials.drafts(batch, 0)
        trials.record(tokens=10, seconds=10 * PLAIN / pace, plain_seconds_per_token=PLAIN)
        if not trials.drafting:
            return ran
    return steps


def _lose(trials: BatchTrials, batch: int, times: int = LOSSES_BEFORE_WAIT) -> None:
    """``times`` trials of ``batch`` replies in a row that never pay."""
    for _ in range(times):
        _plain_steps(trials, batch=batch)
        _drafted(trials, pace=0.8, steps=100, batch=batch)


def test_a_trial_starts_after_the_first_wait_and_is_judged_after_its_steps():
    trials = BatchTrials()
    assert _plain_steps(trials) == FIRST_WAIT
    assert _drafted(trials, pace=KEEP_MARGIN * 0.9, steps=100) == TRIAL_STEPS
    assert trials.pace == pytest.approx(KEEP_MARGIN * 0.9)


def test_drafting_that_pays_goes_on_and_stops_within_a_few_steps_once_it_does_not():
    trials = BatchTrials()
    _plain_steps(trials)
    assert _drafted(trials, pace=1.5, steps=200) == 200 and trials.drafting
    ran = _drafted(trials, pace=0.5, steps=100)
    assert 1 <= ran <= 4 and not trials.drafting


def test_a_first_loss_tries_again_after_the_first_wait_even_where_plain_steps_are_measured():
    trials = BatchTrials()
    _lose(trials, batch=4, times=1)
    assert trials.wait(4, plain_measured=True) == trials.wait(16) == FIRST_WAIT
    assert _plain_steps(trials, batch=4) == FIRST_WAIT
    _drafted(trials, pace=1.5, steps=10)  # the machine was busy a moment: the retry pays
    _drafted(trials, pace=0.8, steps=100)  # a later stop, then a lost retry, are a first loss again
    _lose(trials, batch=4, times=1)
    assert trials.wait(4) == FIRST_WAIT


def test_a_batch_as_large_as_one_that_lost_twice_in_a_row_waits_long_and_a_smaller_one_does_not():
    trials = BatchTrials()
    _lose(trials, batch=8)
    assert trials.wait(8) == trials.wait(16) == LOST_WAIT
    assert _plain_steps(trials, batch=4) == FIRST_WAIT


def test_a_new_batch_is_judged_afresh_after_one_that_lost_twice():
    trials = BatchTrials()
    _lose(trials, batch=8)
    assert trials.wait(8) == LOST_WAIT
    trials.reset()  # the batch ended: one reply left, or none
    assert trials.wait(8) == FIRST_WAIT and _plain_steps(trials, batch=8) == FIRST_WAIT


def test_drafting_that_paid_and_stopped_tries_again_after_the_first_wait_and_then_waits_long():
    trials = BatchTrials()
    _plain_steps(trials, batch=4)
    _drafted(trials, pace=1.5, steps=10, batch=4)  # four replies pay ...
    _drafted(trials, pace=0.8, steps=100, batch=4)  # ... until they do not (or the machine was busy a moment)
    assert trials.wait(4, plain_measured=True) == FIRST_WAIT  # measured or not: no retry at once
    assert _plain_steps(trials, batch=4) == FIRST_WAIT
    _drafted(trials, pace=0.8, steps=100, batch=4)  # the retry loses: a first loss
    assert trials.wait(4) == FIRST_WAIT
    _lose(trials, batch=4, times=1)  # and a second
    assert trials.wait(4) == trials.wait(16) == LOST_WAIT


def test_a_win_where_it_lost_lifts_the_long_wait():
    trials = BatchTrials()
    _lose(trials, batch=8)
    assert trials.wait(8) == trials.wait(16) == LOST_WAIT and trials.wait(7) == FIRST_WAIT
    assert _plain_steps(trials, batch=8) == LOST_WAIT
    _drafted(trials, pace=1.5, steps=TRIAL_STEPS, batch=8)
    assert trials.drafting and trials.wait(8) == trials.wait(16) == FIRST_WAIT


def test_no_trial_while_the_draft_model_is_far_behind_a_reply():
    trials = BatchTrials()
    assert _plain_steps(trials, behind=CLOSE_BEHIND + 1) == 1000
    assert trials.drafts(4, CLOSE_BEHIND)  # the wait has long passed: it tries once the batch is one it can join


def test_a_first_loss_tries_again_where_lookup_drafts_kept_tokens_meanwhile():
    """Replies that keep a lookup draft token a step while the batch waits get ahead of the draft model twice as
    fast as its plain steps: it still tries again after the first wait."""
    trials = BatchTrials()
    _lose(trials, batch=4, times=1)
    steps = next(step for step in range(1000) if trials.drafts(4, behind=2 * (step + 1)))
    assert steps == FIRST_WAIT


def test_recent_steps_weigh_most():
    trials = BatchTrials()
    _plain_steps(trials)
    _drafted(trials, pace=0.9, steps=TRIAL_STEPS - 1)  # slow while the draft model catches up ...
    trials.drafts(4, 0)
    trials.record(tokens=10, seconds=10 * PLAIN / 3.0, plain_seconds_per_token=PLAIN)  # ... then fast
    assert trials.drafting and trials.pace > KEEP_MARGIN


def test_a_batch_whose_plain_steps_are_measured_tries_at_once_unless_it_lost():
    trials = BatchTrials()
    assert trials.wait(4, plain_measured=True) == 0 and trials.drafts(4, 0, plain_measured=True)
    _drafted(trials, pace=0.8, steps=100)
    _lose(trials, batch=4, times=LOSSES_BEFORE_WAIT - 1)
    assert trials.wait(4, plain_measured=True) == LOST_WAIT and trials.wait(2, plain_measured=True) == 0
