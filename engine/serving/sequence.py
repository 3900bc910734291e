"""Per-request state: tokens, the share of them already in the KV cache, block table and timings."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..sampling_params import SamplingParams
from ..step.grammar import Constraint


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """One request as the scheduler and the runner see it."""

    request_id: str
    token_ids: list[int]  # prompt then output; the last one may not be in the KV cache yet
    num_prompt_tokens: int
    params: SamplingParams
    arrival_time: float
    status: Status = Status.WAITING
    num_computed_tokens: int = 0  # tokens whose K/V are in the cache
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)
    num_cached_prompt_tokens: int | None = None  # from the prefix cache at first admission
    disk_pending: bool = False  # more of its cached prefix is on disk, to be read in the next steps
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    source: str = ""  # who sent it ("" for the window's chats, "api" for the local endpoint)
    draft: list[int] = field(default_factory=list)  # tokens proposed for the next step (speculative decoding)
    draft_tokens: int = 0  # proposed and computed, over the whole reply
    accepted_draft_tokens: int = 0  # ... of which the model kept
    draft_computed: int = 0  # leading positions whose KV the draft model has in place (.draft_model)
    # lookup's guess at the first tokens of a draft the draft model writes, for it to check in its first pass
    draft_hint: list[int] = field(default_factory=list)
    # [start, end) character ranges of the reply's text that came from kept draft tokens, in order, touching ones
    # joined (the transcript can highlight them)
    kept_draft_spans: list[tuple[int, int]] = field(default_factory=list)
    constraint: Constraint | None = None  # structured output: its place in its grammar (never drafts)
    reasoning_tokens: int = 0  # output tokens of its reasoning (all of them while it thinks)
    reasoning_end_time: float | None = None  # when its reasoning ended

    def mark_kept_draft(self, start: int, end: int) -> None:
        """Characters ``[start, end)`` of the reply's text came from a kept draft token."""
        if end <= start:
            return
        if self.kept_draft_spans and self.kept_draft_spans[-1][1] == start:
            start = self.kept_draft_spans.pop()[0]
        self.kept_draft_spans.append((start, end))

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
