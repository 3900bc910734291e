"""Speculative decoding's policy: which replies get a draft in the next step, and how long, from measurements.

A draft of ``k`` tokens is computed in the same step as the reply's next token (``k`` more decode rows, see
:meth:`..step.runner.ModelRunner._pack`), and the step keeps the draft tokens the model agrees with, plus one of
its own. It pays when the tokens it is expected to add are worth more than the rows cost, and that depends on
the text (how often drafts are right) and on the machine and the batch (what a row costs). Both are measured
as the engine runs:

- **Acceptance.** Per request, the chance that a draft token is kept given the ones before it were: kept tokens
  over tokens tried (a draft's tokens after its first rejection were never tried), with recent drafts weighing
  most and the engine-wide figure as the prior.
- **Cost.** What a decode step of ``R`` rows takes (:class:`StepCosts`), from every decode step: a line through
  the mean time at each row count seen, with a cautious guess at the slope until two row counts are known.

In ``auto`` each step grows the drafts one token at a time, always the one most likely to be kept (the next
token of a draft whose first ``k`` were kept is kept with probability ``a^(k+1)``), while that token's expected
worth is more than its row's share of the step: ``a^(k+1) > row_cost * tokens / step_time``. So a single chat on
a CPU drafts while its drafts are mostly right, and a large batch (whose rows cost as much as they give) stops.
A request that has not drafted for a while drafts one token now and then, so its acceptance stays measured.
``ngram`` always drafts :data:`FORCED_DRAFT` tokens where lookup finds some; ``off`` never drafts.
"""

from __future__ import annotations

from .metrics import SpeculationStats
from .ngram import NgramProposer
from .sequence import Sequence

MAX_DRAFT = 8  # tokens per draft in auto
FORCED_DRAFT = 5  # tokens per draft when speculation is forced on
PRIOR_ACCEPTANCE, PRIOR_WEIGHT = 0.5, 2.0  # before anything is measured: a coin, worth two tries
REQUEST_DECAY = 0.8  # a request's recent drafts weigh most (its text changes: a quoted passage ends)
ENGINE_DECAY = 0.98
PRIOR_ROW_SHARE = 0.25  # until two row counts are measured, a row is guessed at a quarter of a one-row step
PROBE_EVERY = 16  # steps without a draft before a request tries one token again
COST_DECAY = 0.8  # a row count's mean time follows the machine's load
AGE_DECAY = 0.99  # a row count not seen for a while weighs less (contexts grow, the load changes): half in 70 steps


class Acceptance:
    """Kept draft tokens over tried ones, recent tries weighing most, on a prior."""

    def __init__(self, decay: float, prior: float = PRIOR_ACCEPTANCE, weight: float = PRIOR_WEIGHT) -> None:
        self.decay = decay
        self.kept, self.tried = 0.0, 0.0
        self.prior, self.weight = prior, weight

    def record(self, drafted: int, accepted: int) -> None:
        tried = accepted + (1 if accepted < drafted else 0)
        self.kept = self.kept * self.decay + accepted
        self.tried = self.tried * self.decay + tried

    def rate(self, prior: float | None = None) -> float:
        prior = self.prior if prior is None else prior
        return (self.kept + self.weight * prior) / (self.tried + self.weight)


class StepCosts:
    """Seconds a decode step of ``R`` rows takes, learnt from the steps as they run."""

    def __init__(self) -> None:
        self._mean: dict[int, float] = {}
        self._count: dict[int, int] = {}
        self._seen_at: dict[int, int] = {}
        self._steps = 0

    def observe(self, rows: int, seconds: float) -> None:
        seen = self._count.get(rows, 0)
        self._mean[rows] = seconds if not seen else COST_DECAY * self._mean[rows] + (1 - COST_DECAY) * seconds
        self._count[rows] = seen + 1
        self._steps += 1
        self._seen_at[rows] = self._steps

    @property
    def known(self) -> bool:
        return bool(self._mean)

    def line(self) -> tuple[float, float]:
        """(fixed, per row) seconds: a least-squares line through the row counts seen (each weighing by how often
        it was, up to ten, and less the longer ago), its slope guessed until two counts are known and never below
        1% of a row's share."""
        points = [(rows, mean, min(self._count[rows], 10) * AGE_DECAY ** (self._steps - self._seen_at[rows]))
                  for rows, mean in self._mean.items()]
        total = sum(w for _, _, w in points)
        mean_rows = sum(r * w for r, _, w in points) / total
        mean_time = sum(t * w for _, t, w in points) / total
        spread = sum(w * (r - mean_rows) ** 2 for r, _, w in points)
        floor = 0.01 * mean_time / mean_rows
        if spread == 0:
            slope = PRIOR_ROW_SHARE * mean_time / mean_rows
        else:
            slope = max(floor, sum(w * (r - mean_rows) * (t - mean_time) for r, t, w in points) / spread)
        return max(0.0, mean_time - slope * mean_rows), slope

    def predict(self, rows: int) -> float:
        fixed, per_row = self.line()
        return fixed + per_row * rows


class Speculator:
    """Sets each decoding request's draft before a step, and learns from what the step kept."""

    def __init__(self, mode: str) -> None:
        self.proposer = NgramProposer()
        self.costs = StepCosts()
        self.engine_acceptance = Acceptance(ENGINE_DECAY)
        self._requests: dict[str, Acceptance] = {}
        self._idle_steps: dict[str, int] = {}
        self.num_drafts_total = self.draft_tokens_total = self.accepted_total = 0
        self._speedup: float | None = None
        self._active = False
        self.set_mode(mode)

    def set_mode(self, mode: str) -> None:
        """Draft as ``mode`` says from the next step on; what was measured is kept."""
        self.mode = mode
        self._active = False
        self._reason = "off: chosen in the settings" if mode == "off" else "no reply has been written yet"

    def plan(self, decoding: list[Sequence], room: dict[str, int]) -> None:
        """Give each of ``decoding`` (the requests writing replies) its draft for the next step. ``room``: how
        many tokens each may still take (its ``max_tokens`` and the context, less one for the step's own)."""
        for seq in decoding:
            seq.draft = []
        if self.mode == "off" or not decoding:
            return
        proposals = {}
        for seq in decoding:
            limit = min(room.get(seq.request_id, 0), MAX_DRAFT if self.mode == "auto" else FORCED_DRAFT)
            draft = self.proposer.propose(seq.request_id, seq.token_ids, limit)
            if draft:
                proposals[seq.request_id] = (seq, draft)
        if self.mode == "auto":
            lengths = self._auto_lengths(proposals, len(decoding))
        else:
            lengths = {rid: len(draft) for rid, (_, draft) in proposals.items()}
        for rid, (seq, draft) in proposals.items():
            seq.draft = draft[: lengths.get(rid, 0)]
            self._idle_steps[rid] = 0 if seq.draft else self._idle_steps.get(rid, 0) + 1
        self._active = any(seq.draft for seq, _ in proposals.values())

    def _auto_lengths(self, proposals: dict[str, tuple[Sequence, list[int]]], batch: int) -> dict[str, int]:
        """Draft lengths that maximise the expected tokens per second of the step (see the module's text)."""
        if not self.costs.known:
            self._reason = "auto: measuring what a step costs"
            return {}
        fixed, per_row = self.costs.line()
        step, tokens = fixed + per_row * batch, float(batch)
        prior = self.engine_acceptance.rate()
        rates = {rid: self._acceptance(rid).rate(prior) for rid in proposals}
        lengths = dict.fromkeys(proposals, 0)
        while True:
            candidates = [(rates[rid] ** (lengths[rid] + 1), rid) for rid, (_, draft) in proposals.items()
                          if lengths[rid] < len(draft)]
            if not candidates:
                break
            gain, rid = max(candidates)
            if gain * step <= per_row * tokens:
                break
            lengths[rid] += 1
            step, tokens = step + per_row, tokens + gain
        for rid in proposals:  # a request that has not drafted for a while tries one token, to stay measured
            if lengths[rid] == 0 and self._idle_steps.get(rid, 0) >= PROBE_EVERY:
                lengths[rid] = 1
        drafting = sum(1 for n in lengths.values() if n)
        share = per_row * tokens / step
        self._reason = (f"auto: drafting for {drafting} of {batch} replies (a draft token pays when its chance "
                        f"of being kept is over {share:.0%}; kept lately: {prior:.0%})" if drafting else
                        f"auto: not drafting (a draft token would need a {share:.0%} chance of being kept to pay, "
                        f"and lately {prior:.0%} were)")
        return lengths

    def _acceptance(self, request_id: str) -> Acceptance:
        if request_id not in self._requests:
            self._requests[request_id] = Acceptance(REQUEST_DECAY)
        return self._requests[request_id]

    def record(self, chunks, seconds: float, decode_only: bool) -> None:
        """Learn from a finished step: its chunks (with their drafts and what was kept) and its time.
        ``decode_only``: the step held no prompt work, so its time is a decode step's."""
        rows = drafted_rows = emitted = 0
        for chunk in chunks:
            rows += 1 + len(chunk.draft)
            if not chunk.draft:
                emitted += 1
                continue
            drafted_rows += len(chunk.draft)
            emitted += 1 + chunk.accepted
            self.num_drafts_total += 1
            self.draft_tokens_total += len(chunk.draft)
            self.accepted_total += chunk.accepted
            chunk.seq.draft_tokens += len(chunk.draft)
            chunk.seq.accepted_draft_tokens += chunk.accepted
            self._acceptance(chunk.seq.request_id).record(len(chunk.draft), chunk.accepted)
            self.engine_acceptance.record(len(chunk.draft), chunk.accepted)
        if not decode_only or seconds <= 0:
            return
        if drafted_rows and self.costs.known:
            plain = (rows - drafted_rows) / self.costs.predict(rows - drafted_rows)
            ratio = (emitted / seconds) / plain
            self._speedup = ratio if self._speedup is None else 0.9 * self._speedup + 0.1 * ratio
        self.costs.observe(rows, seconds)

    def finish(self, request_id: str) -> None:
        self.proposer.finish(request_id)
        self._requests.pop(request_id, None)
        self._idle_steps.pop(request_id, None)

    def stats(self) -> SpeculationStats:
        reason = self._reason
        if self.mode == "ngram":
            reason = f"n-gram: forced in the settings, {FORCED_DRAFT} tokens a draft where lookup finds some"
        return SpeculationStats(self.mode, self._active, reason, self.num_drafts_total, self.draft_tokens_total,
                                self.accepted_total, self._speedup)
