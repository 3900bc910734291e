"""Property tests of the scheduler on a tiny pool: outputs equal an unpaged run, nothing is lost, every step moves.

Some workloads speculate: before each step every reply being written gets a draft (the reference's own next
tokens, some of them spoilt), computed after its last token and kept as far as the fake model agrees, as the
runner does. Rejected draft positions hold wrong KV until overwritten, so a roll-back that kept or hashed one
would change an output or fail the pool check.

A fake deterministic model stands in for the forward pass. It writes each scheduled token into a model of the
KV pool through the sequence's block table, and picks the next token from the tokens it reads back through the
block table. So if a prefix-cache hit, a preemption or an eviction served the wrong KV, the output changes and no
longer equals the reference: the same model run over each request's plain token list, with no paging at all.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, event, find, given, settings, target
from hypothesis import strategies as st

from engine.sampling_params import SamplingParams
from engine.serving.block_manager import BlockManager
from engine.serving.scheduler import Chunk, Scheduler, SchedulerOutput
from engine.serving.sequence import Sequence, Status
from engine.serving.speculation import accepted_length
from tests.helpers.paged_kv import FakeKV, check_pool

VOCAB = 4  # prompt tokens; small, so prompts share prefixes
CACHING = (True, True, True, False)  # prefix caching mostly on
MAX_STEPS = 5_000  # far more than any generated workload needs; reaching it means the scheduler stopped moving
SETTINGS = settings(max_examples=600, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def next_token(context: list[int]) -> int:
    """The fake model: a position-sensitive rolling hash of the whole context, as a token in ``0 .. 49``."""
    state = 0
    for token in context:
        state = (state * 31 + token + 1) % 1_000_003
    return state % 50


def reference(prompt: list[int], max_tokens: int) -> list[int]:
    """What the fake model generates for ``prompt`` with no paging, batching or caching."""
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt) :]


@dataclass(frozen=True)
class Request:
    """One request of a workload: when it arrives, its prompt, its length, and when (if ever) it is aborted."""

    arrival_step: int
    prompt: tuple[int, ...]
    max_tokens: int
    abort_after: int | None  # steps after arrival


@dataclass(frozen=True)
class Workload:
    """A pool, scheduler limits and the requests to play against them."""

    num_blocks: int
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_prefix_caching: bool
    requests: tuple[Request, ...]
    draft_length: int = 0  # tokens drafted per step for each reply being written (0: no speculation)
    spoil_seed: int = 0  # which draft tokens are spoilt (about a third)

    @property
    def pool_tokens(self) -> int:
        return self.num_blocks * self.block_size


@st.composite
def workloads(draw, max_requests: int = 8, max_new_tokens: int = 16) -> Workload:
    """Tiny pools under many requests, some sharing a system prompt, some re-sending an earlier conversation."""
    block_size, num_blocks = draw(st.integers(2, 4)), draw(st.integers(6, 24))
    pool_tokens = block_size * num_blocks
    stems = draw(st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=4, max_size=12), min_size=1, max_size=3))
    requests: list[Request] = []
    for _ in range(draw(st.integers(1, max_requests))):
        prompt = draw(st.sampled_from(stems)) + draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=10))
        if requests and draw(st.booleans()):  # the next turn of an earlier conversation
            earlier = draw(st.sampled_from(requests))
            prompt = list(earlier.prompt) + reference(list(earlier.prompt), earlier.max_tokens) + prompt[-2:]
        prompt = prompt[: pool_tokens - 1]
        # The engine refuses a request whose prompt + max_tokens exceeds the pool (Engine._why_it_cannot_fit).
        max_tokens = draw(st.integers(1, min(max_new_tokens, pool_tokens - len(prompt))))
        abort_after = draw(st.none() | st.integers(0, 12)) if draw(st.integers(0, 3)) == 0 else None
        requests.append(Request(draw(st.integers(0, 12)), tuple(prompt), max_tokens, abort_after))
    return Workload(
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=draw(st.integers(1, 8)),
        max_num_batched_tokens=draw(st.integers(1, 32)),
        enable_prefix_caching=draw(st.sampled_from(CACHING)),
        requests=tuple(requests),
        draft_length=draw(st.sampled_from((0, 0, 1, 3, 6))),
        spoil_seed=draw(st.integers(0, 2**16)),
    )


@dataclass
class Outcome:
    """What a workload produced: every request's output tokens, which were aborted, and the scheduler's counts."""

    outputs: dict[int, list[int]]
    aborted: set[int]
    num_preempted: int
    num_cached_prompt_tokens: int
    blocks_used_at_end: int
    steps: int
    drafted: int = 0
    kept: int = 0


class Simulation:
    """Drives a ``Scheduler`` the way ``Engine.step`` does, with the fake model reading and writing ``FakeKV``."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.bm = BlockManager(workload.num_blocks, workload.block_size, workload.enable_prefix_caching)
        self.scheduler = Scheduler(self.bm, workload.max_num_seqs, workload.max_num_batched_tokens)
        self.kv = FakeKV(workload.num_blocks, workload.block_size)
        self.seqs: dict[int, Sequence] = {}
        self.aborted: set[int] = set()
        self.step_index = 0
        self.random = random.Random(workload.spoil_seed)
        self.drafted = self.kept = 0

    def run(self) -> Outcome:
        """Play the whole workload; every step is checked."""
        while self.step_index < MAX_STEPS and (len(self.seqs) < len(self.workload.requests) or self._live()):
            self._arrive_and_abort()
            if self.scheduler.has_unfinished():
                self._step()
            self._check_bookkeeping()
            self.step_index += 1
        assert self.step_index < MAX_STEPS, f"no end after {MAX_STEPS} steps: the scheduler livelocked"
        return Outcome(
            outputs={i: seq.output_token_ids for i, seq in self.seqs.items()},
            aborted=self.aborted,
            num_preempted=self.scheduler.num_preempted_total,
            num_cached_prompt_tokens=sum(seq.num_cached_prompt_tokens or 0 for seq in self.seqs.values()),
            blocks_used_at_end=self.bm.counts().used,
            steps=self.step_index,
            drafted=self.drafted,
            kept=self.kept,
        )

    def _live(self) -> list[Sequence]:
        return [seq for seq in self.seqs.values() if not seq.finished]

    def _arrive_and_abort(self) -> None:
        for index, request in enumerate(self.workload.requests):
            if request.arrival_step == self.step_index:
                params = SamplingParams(max_tokens=request.max_tokens, temperature=0.0)
                self.seqs[index] = Sequence(str(index), list(request.prompt), len(request.prompt), params, 0.0)
                self.scheduler.add(self.seqs[index])
            seq = self.seqs.get(index)
            aborting = request.abort_after is not None and request.arrival_step + request.abort_after == self.step_index
            if aborting and seq is not None and not seq.finished:
                self.scheduler.finish(seq)  # as Engine.abort does
                self.aborted.add(index)

    def _step(self) -> None:
        """One engine step: drafts, schedule, run the fake model over the KV, commit, append new tokens, finish."""
        self._draft()
        out = self.scheduler.schedule()
        assert out.chunks, f"step {self.step_index}: requests are unfinished but nothing was scheduled"
        assert out.failed == [], "a request that fits the pool was failed"
        self._check_output(out)
        sampled = [self._forward(chunk) for chunk in out.chunks]
        self.scheduler.commit(out)
        for chunk, tokens in zip(out.chunks, sampled):
            for token in tokens:
                chunk.seq.token_ids.append(token)
                if chunk.seq.num_output_tokens >= chunk.seq.params.max_tokens:
                    self.scheduler.finish(chunk.seq)
                    break

    def _draft(self) -> None:
        """The reference's next tokens as each writing reply's draft, about a third of them spoilt, within what
        the reply may still take (as ``Engine._plan_drafts`` bounds it)."""
        if not self.workload.draft_length:
            return
        for seq in self.scheduler.decoding():
            room = min(self.workload.draft_length, seq.params.max_tokens - seq.num_output_tokens - 1)
            truth = reference(seq.token_ids, room)
            seq.draft = [(t + 1) % 50 if self.random.random() < 0.3 else t for t in truth]

    def _forward(self, chunk: Chunk) -> list[int]:
        """Write the chunk's tokens (and draft) into the KV; if it samples, the next token from the context read
        back after each of its positions, kept as the runner keeps them."""
        seq, bs = chunk.seq, self.workload.block_size
        assert self.kv.read(seq.block_table, chunk.start) == seq.token_ids[: chunk.start], (
            f"request {seq.request_id} would attend to the wrong KV for positions 0..{chunk.start - 1}"
        )
        for position in range(chunk.start, chunk.end):
            block = self.bm.blocks[seq.block_table[position // bs]]
            assert block.ref_count == 1 and block.hash is None, (
                f"request {seq.request_id} writes position {position} into shared or cached block {block.block_id}"
            )
        written = seq.token_ids[chunk.start : chunk.end - len(chunk.draft)] + list(chunk.draft)
        self.kv.write(seq.block_table, chunk.start, written)
        if not chunk.samples:
            return []
        first = chunk.end - len(chunk.draft)
        targets = [next_token(self.kv.read(seq.block_table, end)) for end in range(first, chunk.end + 1)]
        chunk.accepted = accepted_length(chunk.draft, targets)
        self.drafted, self.kept = self.drafted + len(chunk.draft), self.kept + chunk.accepted
        return targets[: chunk.accepted + 1]

    def _check_output(self, out: SchedulerOutput) -> None:
        """One chunk per running request, each where its sequence stands, within the budget and its blocks."""
        seqs = [chunk.seq for chunk in out.chunks]
        assert len(set(map(id, seqs))) == len(seqs), "a request was scheduled twice in one step"
        assert len(seqs) <= self.workload.max_num_seqs
        assert 0 < out.num_tokens <= self.workload.max_num_batched_tokens
        for chunk in out.chunks:
            assert chunk.seq.status is Status.RUNNING and chunk.seq in self.scheduler.running
            assert chunk.start == chunk.seq.num_computed_tokens and chunk.num_tokens >= 1
            assert chunk.end - len(chunk.draft) <= chunk.seq.num_tokens
            assert not chunk.draft or (chunk.samples and chunk.is_decode), "a draft goes with a decode only"
            assert len(chunk.seq.block_table) >= self.bm.blocks_for(chunk.end)
        for seq in out.preempted:
            assert seq.status is Status.WAITING and seq.block_table == [] and seq not in seqs
        front = list(self.scheduler.waiting)[: len(out.preempted)]
        assert front == out.preempted[::-1], "preempted requests must go back to the front of the queue"

    def _check_bookkeeping(self) -> None:
        """Each live request is in exactly one queue, only running ones hold blocks, and the pool is consistent."""
        running, waiting = self.scheduler.running, list(self.scheduler.waiting)
        assert len(running) <= self.workload.max_num_seqs
        queued = running + waiting
        assert len(set(map(id, queued))) == len(queued), "a request is queued twice"
        assert {id(seq) for seq in queued} == {id(seq) for seq in self._live()}, "a request was lost"
        for seq in waiting:
            assert seq.status is Status.WAITING and seq.block_table == [] and seq.num_computed_tokens == 0
        for seq in running:
            assert seq.status is Status.RUNNING
            assert len(seq.block_table) >= self.bm.blocks_for(seq.num_computed_tokens)
        check_pool(self.bm, [seq.block_table for seq in running], self.kv)


def simulate(workload: Workload) -> Outcome:
    """Play ``workload`` to the end."""
    return Simulation(workload).run()


@SETTINGS
@given(workloads())
def test_every_request_gets_the_unpaged_output_and_the_pool_drains(workload: Workload) -> None:
    """Paging, prefix caching, chunking, preemption and aborts never change what a request generates."""
    outcome = simulate(workload)
    assert set(outcome.outputs) == set(range(len(workload.requests))), "a request never arrived"
    for index, request in enumerate(workload.requests):
        if index not in outcome.aborted:
            assert outcome.outputs[index] == reference(list(request.prompt), request.max_tokens), f"request {index}"
    assert outcome.blocks_used_at_end == 0
    event("preemption" if outcome.num_preempted else "no preemption")
    event("prefix hit" if outcome.num_cached_prompt_tokens else "no prefix hit")
    event("drafts kept and rejected" if 0 < outcome.kept < outcome.drafted else "no mixed drafts")
    target(float(outcome.num_preempted), label="preemptions")


def test_the_workloads_reach_preemption_prefix_hits_and_aborts() -> None:
    """The generator is not too gentle: it makes workloads that preempt, hit the prefix cache and abort."""
    quick = settings(max_examples=2_000, deadline=None, database=None, phases=[Phase.generate])  # no shrinking
    assert simulate(find(workloads(), lambda w: simulate(w).num_preempted > 0, settings=quick)).num_preempted > 0
    hit = find(workloads(), lambda w: simulate(w).num_cached_prompt_tokens > 0, settings=quick)
    assert simulate(hit).num_cached_prompt_tokens > 0
    assert simulate(find(workloads(), lambda w: len(simulate(w).aborted) > 0, settings=quick)).aborted
    mixed = find(workloads(), lambda w: (o := simulate(w)).num_preempted > 0 and 0 < o.kept < o.drafted,
                 settings=quick)
    assert simulate(mixed).num_preempted > 0  # speculation under preemption, with drafts kept and rejected


def test_a_full_pool_preempts_and_recomputes_to_the_same_output() -> None:
    """A pinned case: two requests that cannot both fit, so the newer one is preempted and recomputed."""
    requests = (Request(0, (1, 2, 3, 0, 1), 6, None), Request(0, (3, 2, 1, 0, 3), 6, None))  # 3 blocks each
    workload = Workload(6, 2, 8, 32, True, requests)
    outcome = simulate(workload)
    assert outcome.num_preempted > 0
    assert outcome.outputs == {i: reference(list(r.prompt), r.max_tokens) for i, r in enumerate(requests)}


def test_a_request_as_large_as_the_pool_completes_beside_another() -> None:
    """The engine's up-front bound is exact: prompt + max_tokens == pool tokens still runs, preempting others."""
    requests = (Request(0, (1, 2, 3, 0, 1), 7, None), Request(1, (3, 1, 2), 4, None))  # the first fills 12 slots
    workload = Workload(6, 2, 8, 32, True, requests)
    outcome = simulate(workload)
    assert outcome.num_preempted > 0
    assert outcome.outputs == {i: reference(list(r.prompt), r.max_tokens) for i, r in enumerate(requests)}
    assert outcome.blocks_used_at_end == 0


def test_a_draft_never_takes_the_block_a_prompt_needs() -> None:
    """A pinned case hypothesis found: a reply drafting beside a prompt being computed took the pool's last
    block, the prompt could not finish, and two steps later the reply had to preempt itself."""
    requests = (Request(8, (0,) * 16, 1, None), Request(0, (0,) * 5, 1, None), Request(0, (0,) * 5, 1, None),
                Request(7, (0,) * 9, 8, None), Request(6, (0,) * 9, 7, None), Request(8, (0,) * 5, 9, None))
    workload = Workload(9, 3, 3, 14, False, requests, draft_length=1, spoil_seed=0)
    outcome = simulate(workload)
    assert outcome.drafted > 0
    assert outcome.outputs == {i: reference(list(r.prompt), r.max_tokens) for i, r in enumerate(requests)}
