"""A batch's trials of the draft model: a stretch of plain steps, then drafted steps judged by their pace against
plain steps', kept while they pay, and a longer wait after each trial that lost."""

import pytest

from engine.serving.draft_trials import FIRST_WAIT, KEEP_MARGIN, MAX_WAIT, TRIAL_STEPS, BatchTrials

PLAIN = 0.01  # seconds a plain step of the batch takes per token


def _plain_steps(trials: BatchTrials) -> int:
    """Steps until a trial starts."""
    steps = 0
    while not trials.drafts():
        steps += 1
    return steps


def _drafted(trials: BatchTrials, pace: float, steps: int) -> int:
    """Drafted steps at ``pace`` times a plain step's, until ``steps`` or the trials stop drafting: how many ran."""
    for ran in range(1, steps + 1):
        trials.record(tokens=10, seconds=10 * PLAIN / pace, plain_seconds_per_token=PLAIN)
        if not trials.drafting:
            return ran
    return steps


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
    assert _plain_steps(trials) == FIRST_WAIT  # it paid: the next trial after the first wait


def test_each_losing_trial_doubles_the_wait_up_to_the_most():
    trials = BatchTrials()
    waits = []
    for _ in range(10):
        waits.append(_plain_steps(trials))
        _drafted(trials, pace=0.8, steps=100)
    assert waits[:4] == [FIRST_WAIT, 2 * FIRST_WAIT, 4 * FIRST_WAIT, 8 * FIRST_WAIT]
    assert max(waits) == MAX_WAIT and waits[-1] == MAX_WAIT


def test_recent_steps_weigh_most():
    trials = BatchTrials()
    _plain_steps(trials)
    _drafted(trials, pace=0.9, steps=TRIAL_STEPS - 1)  # slow while the draft model finds its feet ...
    trials.record(tokens=10, seconds=10 * PLAIN / 3.0, plain_seconds_per_token=PLAIN)  # ... then fast
    assert trials.drafting and trials.pace > KEEP_MARGIN
