"""The scheduler by itself: token budget, chunked prefill, FCFS admission, preemption by recompute."""

from engine.sampling_params import SamplingParams
from engine.serving.block_manager import BlockManager
from engine.serving.scheduler import Scheduler
from engine.serving.sequence import Sequence, Status

BS = 4


def make_seq(name, n_prompt, start=0):
    return Sequence(name, list(range(start, start + n_prompt)), n_prompt, SamplingParams(max_tokens=8), 0.0)


def run_step(sched, sampled_token=7):
    """Schedule, pretend the forward pass ran, append a token to each sampling chunk."""
    out = sched.schedule()
    sched.commit(out)
    for chunk in out.chunks:
        if chunk.samples:
            chunk.seq.token_ids.append(sampled_token)
    return out


def test_decode_and_chunked_prefill_share_the_budget():
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=8, max_num_batched_tokens=10)
    a = make_seq("a", 3)
    sched.add(a)
    run_step(sched)  # a prefills (3 tokens) and samples
    b = make_seq("b", 20, start=100)
    sched.add(b)
    out = run_step(sched)
    assert [(c.seq.request_id, c.num_tokens) for c in out.chunks] == [("a", 1), ("b", 9)]
    assert not out.chunks[1].samples  # b's prefill continues next step
    out = run_step(sched)
    assert [(c.seq.request_id, c.num_tokens) for c in out.chunks] == [("a", 1), ("b", 9)]
    out = run_step(sched)
    assert [(c.seq.request_id, c.num_tokens) for c in out.chunks] == [("a", 1), ("b", 2)]
    assert b.num_computed_tokens == 20 and b.num_tokens == 21  # sampled its first token


def test_admission_is_first_come_first_served_and_capped_by_max_num_seqs():
    sched = Scheduler(BlockManager(64, BS), max_num_seqs=2, max_num_batched_tokens=100)
    seqs = [make_seq(str(i), 5, start=10 * i) for i in range(3)]
    for s in seqs:
        sched.add(s)
    out = run_step(sched)
    assert [c.seq.request_id for c in out.chunks] == ["0", "1"]
    assert [s.request_id for s in sched.waiting] == ["2"]
    sched.finish(seqs[0])
    out = run_step(sched)
    assert [c.seq.request_id for c in out.chunks] == ["1", "2"]


def test_a_big_waiting_request_is_not_overtaken_by_a_smaller_one():
    sched = Scheduler(BlockManager(6, BS), max_num_seqs=8, max_num_batched_tokens=100)
    first = make_seq("first", 16)
    sched.add(first)
    run_step(sched)  # holds 5 of 6 blocks
    big, small = make_seq("big", 12, start=50), make_seq("small", 2, start=90)
    sched.add(big)
    sched.add(small)
    out = run_step(sched)
    assert [c.seq.request_id for c in out.chunks] == ["first"]
    assert [s.request_id for s in sched.waiting] == ["big", "small"]


def test_newest_running_request_is_preempted_and_requeued_first():
    sched = Scheduler(BlockManager(4, BS), max_num_seqs=8, max_num_batched_tokens=100)
    old, new = make_seq("old", 8), make_seq("new", 7, start=50)
    sched.add(old)
    sched.add(new)
    run_step(sched)  # old: 2 blocks (+1 sampled token -> needs a 3rd), new: 2 blocks
    assert sched.block_manager.counts().used == 4
    out = run_step(sched)
    assert [s.request_id for s in out.preempted] == ["new"]
    assert new.status is Status.WAITING and new.num_computed_tokens == 0 and new.block_table == []
    assert sched.waiting[0] is new and sched.num_preempted_total == 1
    assert [c.seq.request_id for c in out.chunks] == ["old"]


def test_preempted_request_recomputes_its_generated_tokens_too():
    sched = Scheduler(BlockManager(4, BS), max_num_seqs=8, max_num_batched_tokens=100)
    old, new = make_seq("old", 8), make_seq("new", 7, start=50)
    sched.add(old)
    sched.add(new)
    run_step(sched)
    run_step(sched)  # new is preempted with 8 tokens (7 prompt + 1 generated)
    sched.finish(old)
    out = run_step(sched)
    assert [(c.seq.request_id, c.start, c.num_tokens) for c in out.chunks] == [("new", 4, 4)]  # 1st block cached


def test_finish_releases_blocks_and_keeps_computed_prefix_cached():
    bm = BlockManager(16, BS)
    sched = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100)
    seq = make_seq("a", 9)
    sched.add(seq)
    run_step(sched)
    sched.finish(seq)
    counts = bm.counts()
    assert counts.used == 0 and counts.cached == 2 and seq.status is Status.FINISHED
    again = make_seq("b", 9)
    sched.add(again)
    out = run_step(sched)
    assert out.chunks[0].start == 8 and again.num_cached_prompt_tokens == 8


def _drafting_at_a_blocks_end(sched: Scheduler) -> Sequence:
    """A reply whose next token fills its block, with a three-token draft on offer."""
    a = make_seq("a", 3)
    sched.add(a)
    run_step(sched)  # prefills positions 0-2; the next token goes at 3, the block's last slot
    a.draft = [1, 2, 3]
    return a


def test_a_draft_past_a_blocks_end_takes_the_next_block_while_the_pool_has_spare_ones():
    """A draft is not cut at its reply's block's end where the pool keeps a fresh block for every running request
    besides; where it would not, the draft ends with the block (nothing is evicted or preempted for it)."""
    roomy = Scheduler(BlockManager(3, BS), max_num_seqs=8, max_num_batched_tokens=16)
    a = _drafting_at_a_blocks_end(roomy)
    out = roomy.schedule()
    assert out.chunks[0].draft == (1, 2, 3) and len(a.block_table) == 2
    assert roomy.block_manager.num_fresh == 1  # kept for the reply's next block

    tight = Scheduler(BlockManager(2, BS), max_num_seqs=8, max_num_batched_tokens=16)
    a = _drafting_at_a_blocks_end(tight)
    out = tight.schedule()
    assert out.chunks[0].draft == () and len(a.block_table) == 1 and not out.preempted


def test_a_draft_leaves_the_blocks_a_prompt_still_needs_and_cached_prefixes():
    """A prompt being computed a chunk per step keeps the blocks its rest needs; cached blocks are never taken."""
    for num_blocks, drafted in ((5, ()), (6, (1, 2, 3))):
        sched = Scheduler(BlockManager(num_blocks, BS), max_num_seqs=8, max_num_batched_tokens=7)
        a, b = make_seq("a", 3), make_seq("b", 12, start=100)
        sched.add(a)
        sched.add(b)
        run_step(sched)  # a's prompt, and 4 of b's 12 tokens: b needs two more blocks
        a.draft = [1, 2, 3]  # a's next token fills its block
        out = sched.schedule()
        assert out.chunks[0].seq is a and out.chunks[0].draft == drafted
        assert [c.seq for c in out.chunks] == [a, b] and not out.preempted

    cached = BlockManager(4, BS)
    spent = [cached.allocate(table := [], 8) and table][0]
    cached.commit_full_blocks(spent, [], list(range(8)), 8)
    cached.free(spent)  # two blocks hold a cached prefix now
    sched = Scheduler(cached, max_num_seqs=8, max_num_batched_tokens=16)
    a = _drafting_at_a_blocks_end(sched)
    assert cached.num_fresh == 1
    assert sched.schedule().chunks[0].draft == ()
    assert cached.counts().cached == 2


def test_a_fault_while_a_draft_takes_a_block_fails_only_its_request(monkeypatch):
    sched = Scheduler(BlockManager(8, BS), max_num_seqs=8, max_num_batched_tokens=16)
    a = _drafting_at_a_blocks_end(sched)
    b = make_seq("b", 2, start=100)
    sched.add(b)
    run_step(sched)  # a decodes with its draft (taking a second block); b prefills
    a.draft = []
    run_step(sched)
    a.draft = [1, 2, 3]  # a's next token goes at 5: its draft runs past its second block
    a_blocks = list(a.block_table)
    original = BlockManager.allocate

    def allocate(self, block_table, num_tokens):
        if block_table is a.block_table and num_tokens > len(a_blocks) * BS:
            raise MemoryError("injected")
        return original(self, block_table, num_tokens)

    monkeypatch.setattr(BlockManager, "allocate", allocate)
    out = sched.schedule()
    assert [seq.request_id for seq, _ in out.failed] == ["a"]
    assert [chunk.seq.request_id for chunk in out.chunks] == ["b"]
