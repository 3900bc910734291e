"""Stall-free batching: the pacer learns what steps cost from (fake) step times and sizes prompt chunks so that a
step beside decoding replies stays within the latency target; with nothing decoding a prompt takes the budget."""

import math
import random

import pytest

from engine import EngineConfig
from engine.serving.block_manager import BlockManager
from engine.serving.scheduler import Scheduler
from engine.serving.step_pacer import CONTEXT_UNIT, MIN_CHUNK, StepPacer
from tests.engine.test_scheduler import make_seq, run_step

# A made-up machine: a decode step costs 10 ms + 2 ms a row; prompt work 1 ms a token + 1 us per token of context
BASE, PER_ROW, PER_TOKEN, PER_CONTEXT = 0.010, 0.002, 0.001, 0.000001


def step_time(rows: int, chunks: list[tuple[int, int]]) -> float:
    tokens = sum(n for _, n in chunks)
    context = sum(n * (start + n / 2) for start, n in chunks)
    return BASE + PER_ROW * rows + PER_TOKEN * tokens + PER_CONTEXT * context


def trained(target_s: float = 0.150) -> StepPacer:
    """A pacer that has seen decode steps of 1 to 8 rows and prompt chunks at various depths on that machine."""
    pacer = StepPacer(target_s)
    for i in range(60):
        rows = 1 + i % 8
        pacer.observe(rows, [], step_time(rows, []))
        chunks = [(64 * (i % 16), 32 + 16 * (i % 5))]
        pacer.observe(rows, chunks, step_time(rows, chunks))
    return pacer


def test_the_fit_recovers_the_machines_costs():
    pacer = trained()
    assert pacer.decode.theta == pytest.approx([BASE, PER_ROW], rel=0.02)
    assert pacer.prompt.theta == pytest.approx([PER_TOKEN, PER_CONTEXT * CONTEXT_UNIT], rel=0.05)


@pytest.mark.parametrize("start", [0, 1000, 4000])
def test_a_chunk_fills_the_time_left_beside_the_decodes_and_no_more(start):
    pacer = trained(0.150)
    allowance = pacer.allowance(decode_rows=4)
    n = allowance.take(start, 10_000)
    assert step_time(4, [(start, n)]) <= 0.150 * 1.01 < step_time(4, [(start, n + 8)])
    assert allowance.take(start + n, 10_000) == 0  # nothing left for a second chunk


def test_deeper_chunks_are_smaller_since_they_attend_to_more():
    pacer = trained()
    assert pacer.allowance(4).take(0, 10_000) > pacer.allowance(4).take(4000, 10_000)


def test_with_nothing_decoding_a_prompt_takes_everything_it_wants():
    assert trained().allowance(decode_rows=0).take(0, 2048) == 2048


def test_a_prompt_still_moves_when_the_decodes_alone_pass_the_target():
    pacer = trained(target_s=0.005)  # less than a decode step
    allowance = pacer.allowance(decode_rows=8)
    assert allowance.take(0, 2048) == MIN_CHUNK and allowance.take(MIN_CHUNK, 2048) == 0


def test_the_fit_stays_sane_when_the_steps_barely_differ():
    """60 to 64 rows, noisy times, short chunks: the terms can't be told apart. A recursive fit with forgetting
    went to 1e206 s a step here; the windowed one falls back to what it can tell."""
    rng = random.Random(3)
    pacer = StepPacer(0.150)
    for i in range(3000):
        rows = rng.choice([60, 62, 64])
        pacer.observe(rows, [], step_time(rows, []) * rng.uniform(0.7, 1.3))
        if i % 3 == 0:
            chunks = [(rng.randrange(0, 200), rng.randrange(1, 40))]
            pacer.observe(rows, chunks, step_time(rows, chunks) * rng.uniform(0.7, 1.3))
    assert pacer.decode.predict([1.0, 64.0]) == pytest.approx(step_time(64, []), rel=0.1)
    assert MIN_CHUNK <= pacer.allowance(48).take(100, 10_000) < 10_000


def test_the_pacer_follows_a_machine_that_gets_slower():
    pacer = trained()
    before = pacer.allowance(4).take(0, 10_000)
    for i in range(60):  # something else takes the CPU: everything costs three times as much
        rows = 1 + i % 8
        pacer.observe(rows, [], 3 * step_time(rows, []))
        chunks = [(64 * (i % 16), 32 + 16 * (i % 5))]
        pacer.observe(rows, chunks, 3 * step_time(rows, chunks))
    after = pacer.allowance(4).take(0, 10_000)
    assert after < before / 2.5


def test_the_scheduler_keeps_every_decode_and_chunks_the_newcomer_by_the_allowance():
    pacer = trained(0.150)
    sched = Scheduler(BlockManager(1024, 4), max_num_seqs=8, max_num_batched_tokens=2048, pacer=pacer)
    replies = [make_seq(f"r{i}", 3, start=10 * i) for i in range(4)]
    for seq in replies:
        sched.add(seq)
    run_step(sched)  # nothing decodes yet: all four prompts at once
    newcomer = make_seq("long", 2000, start=1000)
    sched.add(newcomer)
    chunks_seen = []
    while newcomer.num_computed_tokens < 2000:
        out = run_step(sched)
        decodes = [c for c in out.chunks if c.seq is not newcomer]
        assert sorted(c.seq.request_id for c in decodes) == ["r0", "r1", "r2", "r3"]  # never left out
        (chunk,) = [c for c in out.chunks if c.seq is newcomer]
        assert step_time(4, [(chunk.start, chunk.num_tokens)]) <= 0.150 * 1.01
        chunks_seen.append(chunk.num_tokens)
    assert len(chunks_seen) > 10 and sum(chunks_seen) == 2000
    assert chunks_seen[0] > chunks_seen[-1]  # the later chunks attend to more


def test_without_a_pacer_the_whole_prompt_goes_in_one_step():
    sched = Scheduler(BlockManager(512, 4), max_num_seqs=8, max_num_batched_tokens=2048)
    first = make_seq("r", 3)
    sched.add(first)
    run_step(sched)
    sched.add(make_seq("long", 2000, start=1000))
    out = run_step(sched)
    assert [c.num_tokens for c in out.chunks] == [1, 2000]


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan, True, "0.1"])
def test_the_target_must_be_a_positive_number_of_seconds(bad):
    with pytest.raises(ValueError, match="step_latency_target_s must be a positive number of seconds"):
        EngineConfig(step_latency_target_s=bad)
