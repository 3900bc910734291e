"""Continuous batching: which tokens of which requests go into the next forward pass. Pure Python."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from .block_manager import BlockManager, NewBlock
from .sequence import Sequence, Status
from .step_pacer import Allowance, StepPacer


class PrefixExtender(Protocol):
    """Where a prompt's cached prefix can go on once memory's ends (the disk tier, :mod:`.kv_disk`)."""

    def extend(self, seq: Sequence, paced: bool = False) -> int: ...


@dataclass(slots=True)
class Chunk:
    """``num_tokens`` positions of ``seq`` from ``start``, computed in this step.

    A decode chunk may carry a ``draft`` (speculative decoding, :mod:`.speculation`): tokens proposed to follow the
    sequence's last one, computed in the same step after it, so ``num_tokens`` is one plus the draft's length. The
    step keeps the ``accepted`` ones, those the model itself would have chosen.
    """

    seq: Sequence
    start: int
    num_tokens: int
    draft: tuple[int, ...] = ()
    accepted: int = 0

    @property
    def end(self) -> int:
        """One past the last position computed, draft included."""
        return self.start + self.num_tokens

    @property
    def kept_end(self) -> int:
        """One past the last position whose KV the sequence keeps: its own tokens and the accepted draft."""
        return self.end - len(self.draft) + self.accepted

    @property
    def is_decode(self) -> bool:
        """One token past the prompt (and its draft, if any): a reply being written (prompt work is the rest)."""
        return self.num_tokens == 1 + len(self.draft) and self.start >= self.seq.num_prompt_tokens

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the sequence's last token, so the step samples the next one."""
        return self.end - len(self.draft) == self.seq.num_tokens


@dataclass(slots=True)
class SchedulerOutput:
    chunks: list[Chunk] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    failed: list[tuple[Sequence, Exception]] = field(default_factory=list)  # the engine ends these with an error

    @property
    def num_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)


class Scheduler:
    """First come, first served; decode and chunked prefill share one token budget per step.

    Every decoding request gets its token first, oldest first; then prompt chunks, of running requests still
    prefilling and then of waiting ones, within the budget and, while anything decodes, within the step's
    :class:`~.step_pacer.Allowance` (so no reply stalls behind a long prompt). When the pool runs out of blocks
    for a decode, the newest running request is preempted by recompute: its blocks are freed (hashed ones stay
    cached) and it goes back to the front of the queue. Prompt chunks never preempt. Waiting requests are
    admitted while the budget, ``max_num_seqs`` and free blocks allow, never jumping the queue.
    """

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 pacer: StepPacer | None = None, disk: PrefixExtender | None = None) -> None:
        self.block_manager = block_manager
        self.disk = disk  # the prefix cache's disk tier, consulted where memory's cached prefix ends
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.pacer = pacer
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preempted_total = 0

    def add(self, seq: Sequence) -> None:
        seq.status = Status.WAITING
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def decoding(self) -> list[Sequence]:
        """The running requests writing their replies (the ones a draft can go with)."""
        return [seq for seq in self.running if _decoding(seq)]

    def schedule(self) -> SchedulerOutput:
        """Pick this step's chunks."""
        out = SchedulerOutput()
        budget = self._schedule_decodes(out, self.max_num_batched_tokens)
        if out.preempted and out.chunks:  # blocks are short: this step decodes only (nothing at all would stall)
            return out
        decoding = len(out.chunks)
        allowance = self.pacer.allowance(decoding) if self.pacer else Allowance(0, 0, 0, unlimited=True)
        budget = self._schedule_prefills(out, budget, allowance)
        self._schedule_waiting(out, budget, allowance, paced=decoding > 0)
        return out

    def commit(self, out: SchedulerOutput) -> list[NewBlock]:
        """Record that the step's chunks are now in the KV cache, and hash the blocks they filled; returns the
        blocks that entered the prefix cache."""
        registered = []
        for chunk in out.chunks:
            seq = chunk.seq
            seq.num_computed_tokens = chunk.kept_end  # a rejected draft's positions are written over later
            tokens = seq.token_ids + list(chunk.draft[: chunk.accepted]) if chunk.accepted else seq.token_ids
            registered += self.block_manager.commit_full_blocks(
                seq.block_table, seq.block_hashes, tokens, seq.num_computed_tokens
            )
        return registered

    def finish(self, seq: Sequence) -> None:
        """Take a finished or aborted sequence out and release its blocks."""
        if seq.status is Status.RUNNING and seq in self.running:
            self.running.remove(seq)
        elif seq.status is Status.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
        self.block_manager.free(seq.block_table)
        seq.block_hashes = []
        seq.status = Status.FINISHED

    # -- internals ----------------------------------------------------------------------------------

    def _schedule_decodes(self, out: SchedulerOutput, budget: int) -> int:
        """One token for every running request past its prompt, oldest first, preempting if blocks run out;
        with as much of its draft as its blocks and the budget hold."""
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            if not _decoding(seq):
                index += 1
                continue
            draft, seq.draft = seq.draft, []
            allocated = self._allocate_or_preempt(seq, 1, out)
            if allocated is None:
                index += 1  # its allocation failed: the engine ends it, the others carry on
                continue
            if not allocated:
                break  # ``seq`` itself was the newest and has been preempted
            room = self._draft_room(seq, min(len(draft), budget - 1), out)
            if room is None:
                index += 1  # growing its blocks failed: the engine ends it, the others carry on
                continue
            draft = tuple(draft[:room])
            out.chunks.append(Chunk(seq, seq.num_computed_tokens, 1 + len(draft), draft))
            budget -= 1 + len(draft)
            index += 1
        return budget

    def _draft_room(self, seq: Sequence, wanted: int, out: SchedulerOutput) -> int | None:
        """Slots for up to ``wanted`` draft tokens after ``seq``'s next one: what its blocks have left, and its next
        blocks where a draft runs past them and the pool keeps, besides, free blocks holding no cached prefix for
        what every running request still needs (the rest of a prompt; one block for a reply). The reply would
        fill those blocks within a few steps anyway; without them every draft that reaches a block's end is cut
        there. A draft never evicts a cached prefix nor preempts a request, nor holds a prompt back. None (and
        ``seq`` listed as failed) if allocating raised."""
        blocks = self.block_manager
        room = len(seq.block_table) * blocks.block_size - seq.num_computed_tokens - 1
        if room >= wanted:
            return wanted
        needed = seq.num_computed_tokens + 1 + wanted
        missing = blocks.blocks_for(needed) - len(seq.block_table)
        reserve = sum(max(1, blocks.blocks_for(other.num_tokens) - len(other.block_table)) for other in self.running)
        if blocks.num_fresh - missing < reserve:
            return room
        allocated = self._allocate(seq, needed, out)
        return None if allocated is None else wanted if allocated else room

    def _schedule_prefills(self, out: SchedulerOutput, budget: int, allowance: Allowance) -> int:
        """The next prompt chunk of each running request still prefilling, as far as budget and allowance go."""
        for seq in [s for s in self.running if not _decoding(s)]:
            wanted = min(seq.num_uncomputed_tokens, budget)
            num_tokens = allowance.take(seq.num_computed_tokens, wanted)
            if num_tokens <= 0:
                break
            allocated = self._allocate(seq, seq.num_computed_tokens + num_tokens, out)
            if not allocated:
                if allocated is False:
                    break  # no blocks left: the prompt waits for decodes to free some
                continue
            out.chunks.append(Chunk(seq, seq.num_computed_tokens, num_tokens))
            budget -= num_tokens
        return budget

    def _allocate_or_preempt(self, seq: Sequence, num_tokens: int, out: SchedulerOutput) -> bool | None:
        """True once ``seq`` has its blocks; False if it was preempted itself; None if allocating failed."""
        needed = seq.num_computed_tokens + num_tokens
        while not (allocated := self._allocate(seq, needed, out)):
            if allocated is None:
                return None
            victim = self.running[-1]
            self._preempt(victim)
            out.preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _allocate(self, seq: Sequence, num_tokens: int, out: SchedulerOutput) -> bool | None:
        """Grow ``seq``'s blocks to ``num_tokens``; None (and ``seq`` listed as failed) if allocation raises."""
        try:
            return self.block_manager.allocate(seq.block_table, num_tokens)
        except Exception as exc:  # one request's failure must not stop the others
            out.failed.append((seq, exc))
            return None

    def _preempt(self, seq: Sequence) -> None:
        self.running.pop()
        seq.draft = []
        self.block_manager.free(seq.block_table)
        seq.block_hashes = []
        seq.num_computed_tokens = seq.draft_computed = 0
        seq.num_preemptions += 1
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preempted_total += 1

    def _schedule_waiting(self, out: SchedulerOutput, budget: int, allowance: Allowance, paced: bool) -> None:
        """Admit waiting requests in order. ``paced``: replies are being written, so a prefix read from disk
        comes a share per step (the request waits meanwhile, holding what it has read)."""
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            if not seq.block_table:
                self._reuse_cached_prefix(seq, paced)
            elif seq.disk_pending and self.disk is None:  # the tier closed meanwhile: the rest is computed
                seq.disk_pending = False
            elif seq.disk_pending:
                self.disk.extend(seq, paced)
            if seq.disk_pending:
                break
            num_tokens = allowance.take(seq.num_computed_tokens, min(seq.num_uncomputed_tokens, budget))
            if num_tokens <= 0:
                break
            allocated = self._allocate(seq, seq.num_computed_tokens + num_tokens, out)
            if not allocated:
                if allocated is False:
                    self._release_prefix(seq)
                break
            self.waiting.popleft()
            if seq.num_cached_prompt_tokens is None:
                seq.num_cached_prompt_tokens = min(seq.num_computed_tokens, seq.num_prompt_tokens)
            seq.status = Status.RUNNING
            self.running.append(seq)
            out.chunks.append(Chunk(seq, seq.num_computed_tokens, num_tokens))
            budget -= num_tokens

    def _reuse_cached_prefix(self, seq: Sequence, paced: bool = False) -> None:
        match = self.block_manager.match_prefix(seq.token_ids)
        seq.block_table = match.block_ids
        seq.block_hashes = match.hashes
        seq.num_computed_tokens = len(match.block_ids) * self.block_manager.block_size
        if self.disk is not None and self.block_manager.enable_prefix_caching:
            self.disk.extend(seq, paced)

    def _release_prefix(self, seq: Sequence) -> None:
        self.block_manager.free(seq.block_table)
        seq.block_hashes = []
        seq.num_computed_tokens = seq.draft_computed = 0
        seq.disk_pending = False


def _decoding(seq: Sequence) -> bool:
    """Past its prompt: each step gives it one token (a request preempted mid-reply prefills again first)."""
    return seq.num_uncomputed_tokens == 1 and seq.num_computed_tokens >= seq.num_prompt_tokens

