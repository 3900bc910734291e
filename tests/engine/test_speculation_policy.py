"""The speculation policy: a step's cost line learnt from its times, acceptance counted per token tried, and auto's
drafts as long as their expected tokens are worth their rows: long for one chat with cheap rows and drafts that are
right, none where a row costs what it can give, a one-token probe now and then."""

import pytest

from engine.sampling_params import SamplingParams
from engine.serving.draft_trials import FIRST_WAIT, KEEP_MARGIN, TRIAL_STEPS, CatchUp
from engine.serving.scheduler import Chunk
from engine.serving.sequence import Sequence
from engine.serving.speculation import (
    CALIBRATION_AGE,
    CALIBRATION_RANGE,
    FORCED_DRAFT,
    MAX_DRAFT,
    MIN_SPAN,
    PRIOR_ROW_SHARE,
    PROBE_EVERY,
    TO_DRAFT,
    Acceptance,
    Calibration,
    Speculator,
    StepCosts,
)

REPEATING = list(range(40)) * 3  # lookup always finds the continuation


def _seq(name: str) -> Sequence:
    return Sequence(name, list(REPEATING), 10, SamplingParams(max_tokens=500), 0.0)


def _learnt(speculator: Speculator, fixed: float, per_row: float, rows=(1, 2, 4, 8, 16, 32)) -> None:
    for count in rows:
        for _ in range(3):
            speculator.costs.observe(count, fixed + per_row * count)


def test_the_cost_line_is_found_from_step_times():
    costs = StepCosts()
    for rows in (1, 3, 4, 9):
        costs.observe(rows, 0.010 + 0.002 * rows)
    fixed, per_row = costs.line()
    assert fixed == pytest.approx(0.010) and per_row == pytest.approx(0.002)
    assert costs.predict(20) == pytest.approx(0.050)


def test_row_counts_not_seen_for_long_weigh_less():
    costs = StepCosts()
    for _ in range(10):
        costs.observe(8, 0.080)  # measured on a short context, long ago
    for _ in range(300):
        costs.observe(1, 0.020)
        costs.observe(2, 0.030)  # now a row costs 10 ms
    assert costs.line()[1] == pytest.approx(0.010, rel=0.05)


def test_one_row_count_or_near_ones_give_the_guessed_slope():
    costs = StepCosts()
    costs.observe(4, 0.040)
    fixed, per_row = costs.line()
    assert per_row == pytest.approx(PRIOR_ROW_SHARE * 0.010) and fixed + 4 * per_row == pytest.approx(0.040)
    near = StepCosts()
    for rows in (6, 8):  # 18 ms a row between them: too near for that to be more than noise
        near.observe(rows, 0.010 + 0.018 * rows)
    assert near.line()[1] == pytest.approx(PRIOR_ROW_SHARE * 0.136 / 7, rel=0.01)  # a quarter of a row's share
    near.observe(6 + MIN_SPAN, 0.010 + 0.018 * (6 + MIN_SPAN))
    assert near.line() == pytest.approx((0.010, 0.018))  # far enough apart: the slope is theirs


def test_near_row_counts_with_drafts_borrow_the_plain_steps_slope_where_it_is_more():
    plain = StepCosts()
    for rows in (1, 5):  # a plain row costs 6 ms
        plain.observe(rows, 0.020 + 0.006 * rows)
    drafted = StepCosts(plain)
    for rows in (6, 8):
        drafted.observe(rows, 0.030 + 0.004 * rows)  # near counts: the guess would be a quarter of 0.058 / 7
    fixed, per_row = drafted.line()
    assert per_row == pytest.approx(0.006)
    assert fixed + 7 * per_row == pytest.approx(0.058, rel=0.01)  # through the steps' mean (the older weighs less)
    plain.observe(8, 0.020 + 0.010 * 8)  # the plain slope changes: the drafted line follows it
    assert drafted.line()[1] > 0.006
    cheap = StepCosts()
    cheap.observe(1, 0.020)
    cheap.observe(5, 0.0201)  # a slope of 25 us a row: the guess is more, and serves
    guessed = StepCosts(cheap)
    guessed.observe(6, 0.060)
    assert guessed.line()[1] == pytest.approx(PRIOR_ROW_SHARE * 0.010)


def test_acceptance_counts_the_tokens_tried():
    acceptance = Acceptance(decay=1.0, prior=0.5, weight=0.0)
    acceptance.record(5, 2)  # two kept, the third tried and rejected, the last two never tried
    acceptance.record(3, 3)  # all three kept
    assert acceptance.rate() == pytest.approx(5 / 6)


def test_acceptance_tells_a_drafts_first_token_from_the_ones_after_it():
    acceptance = Acceptance(decay=1.0, prior=0.5, weight=0.0)
    acceptance.record(5, 2)  # first kept; of the later ones two tried, one kept
    acceptance.record(3, 3)  # first kept; two later ones kept
    acceptance.record(4, 0)  # first rejected
    assert acceptance.chances() == pytest.approx((2 / 3, 3 / 4))
    assert acceptance.expected(3) == pytest.approx(2 / 3 * (1 + 3 / 4 + 9 / 16))
    assert acceptance.rate() == pytest.approx(5 / 7)  # every tried token, as the panel says


def test_drafts_whose_first_token_is_a_coin_but_whose_runs_go_on_draft_long():
    """A reply copying a file: a draft either found the passage (and its tokens are kept in a run) or not. Tried
    mostly one token at a time, its first tokens are kept half the time; the engine has seen that later tokens are
    kept. One rate for every token (a half, squared for the second...) drafted three tokens here; the first token's
    odds times the later ones' draft all eight."""
    speculator = Speculator("auto")
    _learnt(speculator, fixed=0.010, per_row=0.001, rows=range(1, 12))
    for _ in range(5):
        speculator.engine_acceptance["lookup"].record(8, 8)
        speculator.engine_acceptance["lookup"].record(8, 0)
    for _ in range(20):
        speculator._acceptance("lookup", "a").record(1, 0)
        speculator._acceptance("lookup", "a").record(1, 1)
    seq = _seq("a")
    speculator.plan([seq], {"a": 100})
    assert len(seq.draft) == MAX_DRAFT


def test_right_drafts_with_cheap_rows_draft_long():
    speculator = Speculator("auto")
    _learnt(speculator, fixed=0.010, per_row=0.0005, rows=range(1, 12))
    seq = _seq("a")
    for _ in range(10):
        speculator.engine_acceptance["lookup"].record(8, 8)
        speculator._acceptance("lookup", "a").record(8, 8)
    speculator.plan([seq], {"a": 100})
    assert len(seq.draft) == MAX_DRAFT and speculator.stats().active


def test_row_counts_never_measured_are_tried_one_at_a_time():
    speculator = Speculator("auto")
    _learnt(speculator, fixed=0.010, per_row=0.0005, rows=(1, 2, 3))  # up to two draft tokens measured
    for _ in range(10):
        speculator.engine_acceptance["lookup"].record(8, 8)
    seq = _seq("a")
    speculator.plan([seq], {"a": 100})
    assert len(seq.draft) == 3  # the line promises more, but only one unmeasured count (4 rows) is tried


def test_no_draft_where_a_row_costs_what_it_gives():
    speculator = Speculator("auto")
    _learnt(speculator, fixed=0.0, per_row=0.004)  # a step of 16 rows costs 16 rows: a draft token must be sure
    seqs = [_seq(str(i)) for i in range(16)]
    for _ in range(10):
        speculator.engine_acceptance["lookup"].record(4, 3)
    speculator.plan(seqs, {s.request_id: 100 for s in seqs})
    assert all(s.draft == [] for s in seqs)
    assert "not drafting" in speculator.stats().reason


@pytest.mark.parametrize("batch", [1, 3])
def test_after_a_while_without_drafts_one_step_probes_every_reply(batch):
    speculator = Speculator("auto")
    _learnt(speculator, fixed=0.0, per_row=0.004)
    seqs = [_seq(str(i)) for i in range(batch)]
    lengths = []
    for _ in range(PROBE_EVERY * batch + 1):
        speculator.plan(seqs, {s.request_id: 100 for s in seqs})
        lengths.append([len(s.draft) for s in seqs])
    assert lengths[:-1] == [[0] * batch] * (PROBE_EVERY * batch) and lengths[-1] == [1] * batch


def test_probes_that_keep_nothing_come_less_often_until_one_keeps_a_token():
    speculator = Speculator("auto")
    _learnt(speculator, fixed=0.0, per_row=0.004)
    seq = _seq("a")

    def steps_to_probe(kept: int) -> int:
        for steps in range(10_000):
            speculator.plan([seq], {"a": 100})
            if seq.draft:
                speculator.record([Chunk(seq, seq.num_tokens - 1, 2, tuple(seq.draft), kept)], 0.008, True)
                return steps
            speculator.record([Chunk(seq, seq.num_tokens - 1, 1, (), 0)], 0.004, decode_only=True)
        return steps

    waits = [steps_to_probe(kept=0) for _ in range(5)]
    assert waits == [PROBE_EVERY * n for n in (1, 2, 4, 8, 8)]  # up to PROBE_BACKOFF_MOST times
    steps_to_probe(kept=1)
    assert steps_to_probe(kept=0) == PROBE_EVERY


def test_a_batch_drafts_only_when_every_reply_gains():
    speculator = Speculator("auto")
    _learnt(speculator, fixed=0.010, per_row=0.0005, rows=range(1, 40))
    for _ in range(10):
        speculator.engine_acceptance["lookup"].record(8, 8)
    seqs = [_seq(str(i)) for i in range(4)]
    speculator.plan(seqs, {s.request_id: 100 for s in seqs})
    assert all(len(s.draft) > 0 for s in seqs)  # cheap rows, right drafts: every reply drafts
    lone = Sequence("lone", list(range(1000, 1050)), 10, SamplingParams(max_tokens=500), 0.0)  # nothing to look up
    speculator.plan([*seqs, lone], {s.request_id: 100 for s in [*seqs, lone]})
    assert all(s.draft == [] for s in seqs)  # drafts would slow the reply that has none


def test_forced_and_off_modes_and_the_room_left():
    forced, off = Speculator("ngram"), Speculator("off")
    seq = _seq("a")
    forced.plan([seq], {"a": 100})
    assert len(seq.draft) == FORCED_DRAFT
    forced.plan([seq], {"a": 2})
    assert len(seq.draft) == 2  # max_tokens or the context leave room for two
    off.plan([seq], {"a": 100})
    assert seq.draft == [] and off.stats().draft_tokens_total == 0


def test_auto_waits_for_a_measured_step_before_drafting():
    speculator = Speculator("auto")
    seq = _seq("a")
    speculator.plan([seq], {"a": 100})
    assert seq.draft == [] and "measuring" in speculator.stats().reason


def _unfound(count: int) -> list[Sequence]:
    """Replies lookup finds nothing for: only the draft model's drafts are on offer."""
    return [Sequence(str(i), list(range(1000 + 50 * i, 1050 + 50 * i)), 10, SamplingParams(max_tokens=500), 0.0)
            for i in range(count)]


def _step(speculator: Speculator, seqs: list[Sequence], kept: int, seconds: float,
          caught_up: CatchUp = CatchUp.NONE) -> None:
    """The planned step ran: each draft had its first ``kept`` tokens kept, in ``seconds`` (draft passes too)."""
    chunks = [Chunk(s, s.num_tokens - 1, 1 + len(s.draft), tuple(s.draft), min(kept, len(s.draft))) for s in seqs]
    draft_seconds = 0.001 if any(s.draft for s in seqs) else 0.0  # the draft model's passes, part of the time
    speculator.record(chunks, seconds - draft_seconds, decode_only=True, draft_seconds=draft_seconds,
                      caught_up=caught_up)


def test_a_lone_reply_weighs_the_draft_model_step_by_step():
    speculator = Speculator("auto", draft_model="m")
    _learnt(speculator, fixed=0.010, per_row=0.0005, rows=range(1, 12))
    for _ in range(10):
        speculator.engine_acceptance["model"].record(8, 8)
    [lone] = _unfound(1)
    speculator.plan([lone], {"0": 100})
    assert lone.draft and set(lone.draft) == {TO_DRAFT}
    speculator.plan([lone], {"0": 3})
    assert lone.draft == [TO_DRAFT] * 3  # within the room left


def _four_replies_level_with_the_draft_model(plain_step: float):
    """A speculator with a draft model, plain steps of one to nine rows measured at ``plain_step``, and four
    replies lookup finds nothing for whose every token the draft model has computed; and their room."""
    speculator = Speculator("auto", draft_model="m")
    for rows in range(1, 10):
        for _ in range(3):
            speculator.costs.observe(rows, plain_step)
    seqs = _unfound(4)
    for seq in seqs:
        seq.draft_computed = seq.num_tokens - 1
    return speculator, seqs, {s.request_id: 100 for s in seqs}


def test_a_batch_tries_the_draft_model_and_drafts_while_its_steps_come_faster():
    """In a batch the draft model is not priced step by step but tried: after a stretch of plain steps every reply
    drafts with it, goes on while the drafted steps come faster than plain steps of the batch would have for the
    same tokens, and stops once they do not (the next trial after a longer wait)."""
    plain_step = 0.040  # four replies' plain step: 100 tokens/s
    speculator, seqs, room = _four_replies_level_with_the_draft_model(plain_step)
    seqs[3].draft_computed = seqs[3].num_prompt_tokens + 1  # ... but one it sat out for a stretch
    for _ in range(FIRST_WAIT + 1):
        speculator.plan(seqs, room)
        assert all(s.draft == [] for s in seqs)
        _step(speculator, seqs, 0, plain_step)
    assert "next trial with replies it has not fallen behind" in speculator.stats().reason
    seqs = seqs[:3]
    for _ in range(3 * TRIAL_STEPS):  # four kept of five: 15 tokens in two plain steps' time, 2.5x the pace
        speculator.plan(seqs, room)
        assert all(s.draft == [TO_DRAFT] * FORCED_DRAFT for s in seqs)
        _step(speculator, seqs, 4, 2 * plain_step)
    assert speculator.trials.pace == pytest.approx(2.5) and "2.50x" in speculator.stats().reason
    speculator.plan(seqs, room)  # a reply joins: the draft model catches up on its prompt in a slow step ...
    _step(speculator, seqs, 4, 20 * plain_step, caught_up=CatchUp.PROMPT)
    speculator.plan(seqs, room)
    assert speculator.trials.pace == pytest.approx(2.5) and all(s.draft for s in seqs)  # ... not judged
    speculator.set_mode("off")  # plain steps while the mode is off are not the trial's
    for _ in range(8 * TRIAL_STEPS):
        speculator.plan(seqs, room)
        _step(speculator, seqs, 0, plain_step)
    speculator.set_mode("auto")  # a new mode: a new trial, at once (plain steps of three replies are measured)
    for seq in seqs:
        seq.draft_computed = seq.num_tokens - 1
    speculator.plan(seqs, room)
    assert all(s.draft for s in seqs) and speculator.trials.starting
    stopped_after = 0
    while all(s.draft for s in seqs):  # then nothing is kept: 4 tokens in two plain steps' time
        _step(speculator, seqs, 0, 2 * plain_step)
        stopped_after += 1
        speculator.plan(seqs, room)
    assert 1 <= stopped_after <= 6 and speculator.trials.pace < KEEP_MARGIN
    assert "not drafting" in speculator.stats().reason


def test_a_trials_catching_up_on_prompts_is_not_judged():
    """A new batch's first drafted steps catch up on what the draft model had not computed of the replies'
    prompts: the prompts' cost, paid once per request whenever drafting starts, not the trial's. It is judged on
    its other steps, so a batch whose drafts pay goes on drafting (judged with those steps, a new batch of four
    chats of the rewrite lost its first trial at 0.83x where its later steps came 1.15-1.4x as fast)."""
    plain_step = 0.040  # four replies' plain step
    speculator, seqs, room = _four_replies_level_with_the_draft_model(plain_step)
    speculator.plan(seqs, room)  # plain steps of four replies are measured: the trial starts at once
    assert all(s.draft == [TO_DRAFT] * FORCED_DRAFT for s in seqs) and speculator.trials.starting
    for _ in range(2):  # catching up on the prompts: ten plain steps' time each
        _step(speculator, seqs, 4, 10 * plain_step, caught_up=CatchUp.PROMPT)
        speculator.plan(seqs, room)
        assert all(s.draft for s in seqs)
    for _ in range(TRIAL_STEPS):  # four kept of five: 20 tokens in two plain steps' time, 2.5x the pace
        _step(speculator, seqs, 4, 2 * plain_step)
        speculator.plan(seqs, room)
    assert speculator.trials.pace == pytest.approx(2.5) and all(s.draft for s in seqs)


def test_a_batch_that_shrinks_to_one_reply_ends_its_trial():
    """... and a new batch, where plain steps of as many replies have not been measured, waits the first steps."""
    speculator = Speculator("auto", draft_model="m")
    for rows in (1, 2, 5, 6, 7, 8):
        for _ in range(3):
            speculator.costs.observe(rows, 0.040)
    seqs = _unfound(3)
    for seq in seqs:
        seq.draft_computed = seq.num_tokens - 1
    room = {s.request_id: 100 for s in seqs}
    for _ in range(FIRST_WAIT + 1):
        speculator.plan(seqs, room)
    assert speculator.trials.drafting
    speculator.plan(seqs[:1], room)  # one reply left: it is weighed step by step
    speculator.plan(seqs, room)  # a new batch waits the first steps
    assert not speculator.trials.drafting and all(s.draft == [] for s in seqs)


def _bursty_batch(speculator: Speculator, steps: int = 40) -> int:
    """Four replies whose drafts are kept in bursts (all of them two steps running, then none), each step costing
    what the line says: the steps that drafted."""
    _learnt(speculator, fixed=0.010, per_row=0.002, rows=range(1, 40))
    for _ in range(10):
        speculator.engine_acceptance["lookup"].record(8, 8)
    seqs = [_seq(str(i)) for i in range(4)]
    drafted = 0
    for step in range(steps):
        speculator.plan(seqs, {s.request_id: 100 for s in seqs})
        rows = sum(1 + len(s.draft) for s in seqs)
        drafted += rows > len(seqs)
        kept = step % 3 != 2
        chunks = [Chunk(s, s.num_tokens - 1, 1 + len(s.draft), tuple(s.draft), len(s.draft) if kept else 0)
                  for s in seqs]
        speculator.record(chunks, speculator.costs.predict(rows), decode_only=True)
    return drafted


def test_a_batch_whose_drafted_steps_come_out_below_their_forecast_stops_drafting_sooner():
    uncalibrated = Speculator("auto")
    uncalibrated.calibration.factor = lambda batch: 1.0
    speculator = Speculator("auto")
    assert 0 < _bursty_batch(speculator) < _bursty_batch(uncalibrated)
    assert speculator.calibration.factor(4) < 1 and "forecast" in speculator.stats().reason
    alone = _seq("alone")
    speculator.plan([alone], {"alone": 100})
    assert alone.draft  # a single reply's forecasts are its own: it still drafts


def test_calibration_is_the_rate_that_came_over_the_rate_forecast_within_its_range():
    calibration = Calibration()
    assert calibration.factor(1) == 1.0
    for _ in range(200):
        calibration.record(1, forecast_rate=100.0, rate=70.0)
        calibration.record(2, forecast_rate=100.0, rate=10.0)
    assert calibration.factor(1) == pytest.approx(0.7) and calibration.factor(2) == CALIBRATION_RANGE[0]


def test_calibration_fades_back_towards_one_over_steps_without_drafts():
    """Only steps with drafts measure the forecasts' error, and a low factor keeps drafts away: steps without
    drafts let it return (else a few unlucky steps stop a reply's drafts for good)."""
    calibration = Calibration()
    for _ in range(30):
        calibration.record(1, forecast_rate=100.0, rate=50.0)
    low = calibration.factor(1)
    assert low == pytest.approx(0.5, abs=0.03)
    calibration.age(4)  # another batch size's steps leave it be
    assert calibration.factor(1) == low
    steps = 34
    for _ in range(steps):
        calibration.age(1)
    assert calibration.factor(1) == pytest.approx(1 - (1 - low) * CALIBRATION_AGE ** steps)


def test_a_reply_whose_drafts_came_out_badly_drafts_again_after_plain_steps():
    speculator = Speculator("auto")
    for _ in range(10):
        speculator.engine_acceptance["lookup"].record(8, 8)
    for _ in range(30):
        speculator.calibration.record(1, forecast_rate=100.0, rate=50.0)  # unlucky drafted steps
    _learnt(speculator, fixed=0.010, per_row=0.008, rows=range(1, 12))  # drafts promise ~1.8x: 0.9x calibrated
    seq = _seq("a")
    steps = 0
    while True:
        speculator.plan([seq], {"a": 100})
        if seq.draft or steps > 200:
            break
        steps += 1
        speculator.record([Chunk(seq, seq.num_tokens - 1, 1, (), 0)], speculator.costs.predict(1), decode_only=True)
    assert 0 < steps < 100 and len(seq.draft) > 1  # drafting again, not a one-token probe


def test_a_reply_with_no_draft_keeps_a_batch_from_drafting_however_well_drafts_came_out():
    speculator = Speculator("auto")
    _learnt(speculator, fixed=0.010, per_row=0.0005, rows=range(1, 40))
    for _ in range(10):
        speculator.engine_acceptance["lookup"].record(8, 8)
    speculator.calibration.factor = lambda batch: CALIBRATION_RANGE[1]  # drafted steps came out above forecast
    seqs = [_seq(str(i)) for i in range(4)]
    lone = Sequence("lone", list(range(1000, 1050)), 10, SamplingParams(max_tokens=500), 0.0)  # nothing to look up
    speculator.plan([*seqs, lone], {s.request_id: 100 for s in [*seqs, lone]})
    assert all(s.draft == [] for s in seqs)  # the lone reply gets one token whatever the others draft
    speculator.plan(seqs, {s.request_id: 100 for s in seqs})
    assert all(len(s.draft) > 0 for s in seqs)
