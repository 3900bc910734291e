"""Speculative decoding's policy: which replies get a draft in the next step, and how long, from measurements.

A draft of ``k`` tokens is computed in the same step as the reply's next token (``k`` more decode rows, see
:meth:`..step.runner.ModelRunner._pack`), and the step keeps the draft tokens the model agrees with, plus one of
its own. It pays when the tokens it is expected to add are worth more than the rows cost, and that depends on
the text (how often drafts are right) and on the machine and the batch (what a row costs). Both are measured
as the engine runs:

- **Acceptance.** Per request, the chance that a draft token is kept given the ones before it were: kept tokens
  over tokens tried (a draft's tokens after its first rejection were never tried), a draft's first token apart
  from its later ones (whether a draft is right at all shows at its first token), with recent drafts weighing
  most and the engine-wide figures as the prior.
- **Cost.** What a decode step of ``R`` rows takes (:class:`StepCosts`): a line through the mean time at each row
  count seen, one for plain steps and, per number of replies in the step, one for steps with drafts (which cost
  more than their rows: the rows' sampling, the run's bookkeeping, and a draft model's passes, one per token of
  the longest draft). Until a table's row counts are :data:`MIN_SPAN` apart its slope is a guess, or the plain
  steps' slope where that is known and more (a slope between near counts is mostly noise).

In ``auto`` each step ranks the draft tokens on offer by their chance of being kept (a draft's token ``k`` is
kept with probability ``f * a^k``: ``f`` its first token's chance, ``a`` a later one's given the one before, each
measured as above) and takes the ``e`` best for the ``e`` that
makes the slowest reply of the step fastest: each reply's expected tokens over the step's measured time at that
many rows, against one token in a plain step's measured time, and only if that is :data:`MARGIN` better
(:data:`BATCH_MARGIN` for several replies: a reply whose drafts happen to fail is slowed by the others'). Every
reply in a step waits for the whole step, so a draft for one chat slows the others: drafts go ahead only where
every reply in the step is expected to come faster. So a single chat on a CPU drafts while its drafts are mostly
right; a batch drafts only when all of its replies have drafts that pay, and less as it grows (its rows cost
as much as they give). After :data:`PROBE_EVERY` steps per reply without a draft, one step gives every reply
with a draft on offer one token, so acceptance (and what a step with drafts costs) stays measured; after a probe
whose tokens were all rejected the next waits twice as long (up to :data:`PROBE_BACKOFF_MOST` times).
``ngram`` always drafts :data:`FORCED_DRAFT` tokens where lookup finds some; ``off`` never drafts.

**Where drafts come from.** N-gram lookup (:mod:`.ngram`) first: its drafts are free, but only where the text
repeats. With a draft model loaded (:mod:`.draft_model`), a lone reply that lookup has nothing for in ``auto``
(every reply in ``draft``) has the draft model's on offer: the plan is then a length, and the draft model writes
that many tokens (:data:`TO_DRAFT` until then) once the step's blocks are known, with what lookup guesses of them as
a hint that can save it passes. Its passes are part of what such a step costs, so steps with its drafts are measured
apart from steps with lookup's only. In a batch, auto does not price the draft model's drafts step by step but tries
them (:mod:`.draft_trials`): every reply drafts :data:`FORCED_DRAFT` tokens with it for as long as its steps come
faster than plain ones, and lookup's drafts are weighed as above in between.
"""

from __future__ import annotations

from .draft_trials import BatchTrials, CatchUp
from .metrics import SpeculationStats
from .ngram import NgramProposer
from .sequence import Sequence

MAX_DRAFT = 8  # tokens per draft in auto
SOURCES = ("lookup", "model")  # n-gram lookup, the draft model
HINTS = "hint"  # lookup's guesses checked by the draft model (see :meth:`Speculator._model_draft`)
# what one more position in a draft pass costs, as a share of a one-position pass: the default model's int4 copy
# over 3,600 positions on a 2-core CPU took 8.6 ms a pass at one position, 12 at two, 16 at four and 20.5 at six
HINT_ROW_COST = 0.25
TO_DRAFT = -1  # a draft token the draft model writes once the step is scheduled (a plan only knows the length)
FORCED_DRAFT = 5  # tokens per draft when speculation is forced on
PRIOR_ACCEPTANCE, PRIOR_WEIGHT = 0.5, 2.0  # before anything is measured: a coin, worth two tries
REQUEST_DECAY = 0.8  # a request's recent drafts weigh most (its text changes: a quoted passage ends)
ENGINE_DECAY = 0.98
PRIOR_ROW_SHARE = 0.25  # until row counts far enough apart are measured, a row is guessed at a quarter of a step
PROBE_EVERY = 16  # steps without a draft (times the batch) before the replies try one token each again ...
# ... twice as long after each probe whose tokens were all rejected, up to this many times as long: on the story at
# one chat, where lookup finds little, a bench run's probes kept 1 token of 8, and each made a one-row step two rows
PROBE_BACKOFF_MOST = 8
MARGIN = 1.03  # drafts must promise this much more than a plain step: what is measured is noisy
# ... and this much where several replies share the step: each waits for the whole step, so the one whose drafts
# happen to fail is slowed by the others' rows (expected gains hide that; the bench's four chats showed it)
BATCH_MARGIN = 1.25
# row counts the steps seen must span before the line's slope is theirs: four chats' first steps with drafts,
# at six and eight rows, gave one of 18 ms a row where the step with five-token drafts took 5 ms a row more.
# Until then a table of steps with drafts takes the plain steps' slope where theirs is known (four chats: 6 ms
# a row, where a quarter of a step guessed 2.3 ms and auto drafted ten tokens into a step that took twice a
# plain one's time), or the guess where it is more
MIN_SPAN = 4
MEASURED = 3  # steps at a row count before its own mean is trusted over the line
COST_DECAY = 0.8  # a row count's mean time follows the machine's load
AGE_DECAY = 0.99  # a row count not seen for a while weighs less (contexts grow, the load changes): half in 70 steps
# how far a step with drafts may come out above or below its forecast, as a factor on later forecasts (see
# :class:`Calibration`), and how fast it follows: four chats' drafts forecast at 1.3x came out at 0.9x (kept
# tokens come in bursts, and twenty rows cost more than the line through six to fourteen says)
CALIBRATION_RANGE = (0.5, 1.5)
CALIBRATION_DECAY = 0.9
CALIBRATION_AGE = 0.98  # per step without drafts the factor's distance from one shrinks by this: half in 34 steps


def accepted_length(draft: list[int] | tuple[int, ...], targets: list[int] | tuple[int, ...]) -> int:
    """How many leading draft tokens equal the model's own choice at their position."""
    count = 0
    while count < len(draft) and draft[count] == targets[count]:
        count += 1
    return count


class Acceptance:
    """Kept draft tokens over tried ones, recent tries weighing most, on a prior; a draft's first token apart from
    the ones after it. Whether a draft is right at all (lookup found the passage the reply goes on to copy, or not)
    shows at its first token, and once one is kept the next mostly is too. One rate for both took the first
    token's odds for every later one, and auto, trying mostly one-token drafts where unsure, never learnt better:
    on the rewrite at one chat lookup's first tokens were kept about half the time and later ones about nine in
    ten, so auto drafted a token or none in most steps (1.19x of off) where forced five-token drafts gave 1.43x."""

    def __init__(self, decay: float, prior: float = PRIOR_ACCEPTANCE, weight: float = PRIOR_WEIGHT) -> None:
        self.decay = decay
        self.kept, self.tried = 0.0, 0.0  # every token
        self.first_kept, self.first_tried = 0.0, 0.0  # drafts' first tokens
        self.prior, self.weight = prior, weight

    def record(self, drafted: int, accepted: int) -> None:
        tried = accepted + (1 if accepted < drafted else 0)
        self.kept = self.kept * self.decay + accepted
        self.tried = self.tried * self.decay + tried
        self.first_kept = self.first_kept * self.decay + (1 if accepted else 0)
        self.first_tried = self.first_tried * self.decay + 1

    def rate(self) -> float:
        """Any tried token's chance of being kept (what the panel calls kept lately)."""
        return (self.kept + self.weight * self.prior) / (self.tried + self.weight)

    def chances(self, prior: tuple[float, float] | None = None) -> tuple[float, float]:
        """(first, later): the chance a draft's first token is kept, and a later token's given the one before it
        was; each on ``prior`` (the same pair, engine-wide) or this one's prior rate."""
        first_prior, later_prior = (self.prior, self.prior) if prior is None else prior
        first = (self.first_kept + self.weight * first_prior) / (self.first_tried + self.weight)
        later_kept, later_tried = self.kept - self.first_kept, self.tried - self.first_tried
        return first, (later_kept + self.weight * later_prior) / (later_tried + self.weight)

    def expected(self, tokens: int, prior: tuple[float, float] | None = None) -> float:
        """Tokens a draft of ``tokens`` is expected to have kept."""
        first, later = self.chances(prior)
        return sum(first * later ** j for j in range(tokens))


class StepCosts:
    """Seconds a decode step of ``R`` rows takes, learnt from the steps as they run."""

    def __init__(self, fallback: StepCosts | None = None) -> None:
        self._mean: dict[int, float] = {}
        self._count: dict[int, int] = {}
        self._seen_at: dict[int, int] = {}
        self._steps = 0
        self.fallback = fallback  # whose slope serves while this table's row counts are near (see MIN_SPAN)
        self._line: tuple[float, float] | None = None  # line()'s answer until the next observation (its or
        self._line_at: tuple[int, int] = (0, 0)          # the fallback's)

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
        it was, up to ten, and less the longer ago), its slope borrowed or guessed until the counts seen span
        :data:`MIN_SPAN` rows, and never below 1% of a row's share. (Asked for every draft length a step weighs:
        kept until the next observation.)"""
        at = (self._steps, self.fallback._steps if self.fallback else 0)
        if self._line is None or at != self._line_at:
            self._line, self._line_at = self._fit(), at
        return self._line

    @property
    def spans(self) -> bool:
        """The row counts seen are far enough apart for a slope of their own (:data:`MIN_SPAN`)."""
        return bool(self._mean) and max(self._mean) - min(self._mean) >= MIN_SPAN

    def _fit(self) -> tuple[float, float]:
        points = [(rows, mean, min(self._count[rows], 10) * AGE_DECAY ** (self._steps - self._seen_at[rows]))
                  for rows, mean in self._mean.items()]
        total = sum(w for _, _, w in points)
        mean_rows = sum(r * w for r, _, w in points) / total
        mean_time = sum(t * w for _, t, w in points) / total
        spread = sum(w * (r - mean_rows) ** 2 for r, _, w in points)
        floor = 0.01 * mean_time / mean_rows
        if not self.spans:  # a slope between near row counts is mostly noise
            slope = PRIOR_ROW_SHARE * mean_time / mean_rows
            if self.fallback is not None and self.fallback.spans:
                slope = max(slope, self.fallback.line()[1])
        else:
            slope = max(floor, sum(w * (r - mean_rows) * (t - mean_time) for r, t, w in points) / spread)
        return max(0.0, mean_time - slope * mean_rows), slope

    def measured(self, rows: int) -> bool:
        return self._count.get(rows, 0) >= MEASURED

    def predict(self, rows: int) -> float:
        """The mean time measured at ``rows`` where it has been seen a few times, else the line's. (Steps do not
        cost in a straight line: on two cores an odd row count takes as long as the next even one.)"""
        if self.measured(rows):
            return self._mean[rows]
        fixed, per_row = self.line()
        return fixed + per_row * rows


class Calibration:
    """What steps with drafts gave against what auto forecast for them, per number of replies in the step: tokens
    per second came over tokens per second forecast, recent steps weighing most, starting at one. Auto's forecast
    is a model (tokens kept at measured rates, costs on a line); this is its measured error, and later forecasts
    are multiplied by it. Only steps with drafts measure it, and a low factor keeps drafts away, so without them
    it fades back towards one (:meth:`age`): a few unlucky steps at the start of the rewrite at one chat had set it
    to 0.58, and the reply never drafted again where forced drafts gave 1.4x."""

    def __init__(self) -> None:
        self._came: dict[int, float] = {}
        self._forecast: dict[int, float] = {}

    def factor(self, batch: int) -> float:
        low, high = CALIBRATION_RANGE
        forecast = self._forecast.get(batch)
        return 1.0 if not forecast else min(high, max(low, self._came[batch] / forecast))

    def record(self, batch: int, forecast_rate: float, rate: float) -> None:
        """A step of ``batch`` replies forecast at ``forecast_rate`` tokens/s came at ``rate``. (Sums of rates
        relative to the forecast, one prior step at the forecast: one unlucky step moves the factor a tenth.)"""
        if batch not in self._forecast:
            self._came[batch] = self._forecast[batch] = 1.0
        self._came[batch] = CALIBRATION_DECAY * self._came[batch] + rate / forecast_rate
        self._forecast[batch] = CALIBRATION_DECAY * self._forecast[batch] + 1.0

    def age(self, batch: int) -> None:
        """A step of ``batch`` replies without drafts: what was measured weighs a little less against one."""
        if batch in self._forecast:
            self._came[batch] = CALIBRATION_AGE * self._came[batch] + (1 - CALIBRATION_AGE) * self._forecast[batch]


class Speculator:
    """Sets each decoding request's draft before a step, and learns from what the step kept."""

    def __init__(self, mode: str, draft_model: str | None = None) -> None:
        self.proposer = NgramProposer()
        self.draft_model = draft_model  # the draft model's name, where one is loaded
        self.costs = StepCosts()  # plain decode steps
        # decode steps with drafts, per number of replies in the step: with lookup's drafts, and with the draft
        # model's (its passes included: one per token of the longest draft, so the replies' count matters)
        self.lookup_costs: dict[int, StepCosts] = {}
        self.model_costs: dict[int, StepCosts] = {}
        # kept over tried, per source of drafts ("lookup", "model"): engine-wide (the prior) and per request
        self.engine_acceptance = {source: Acceptance(ENGINE_DECAY) for source in (*SOURCES, HINTS)}
        self._requests: dict[tuple[str, str], Acceptance] = {}
        self._sources: dict[str, str] = {}  # where each request's draft in the step came from
        self._plain_steps = 0  # decode steps in a row without a draft, in auto
        self._probe_every = PROBE_EVERY  # ... before the next probe (longer while probes keep failing)
        self._probing = False  # the step's drafts are a probe
        self.num_drafts_total = self.draft_tokens_total = self.accepted_total = 0
        self._speedup: float | None = None
        self.calibration = Calibration()  # auto's forecasts for steps with drafts against what they gave
        self._forecast: tuple[int, float] | None = None  # the step's: (replies, tokens/s) where auto drafts
        self.trials = BatchTrials()  # in auto, whether a batch drafts with the draft model
        self._batch_trial = False  # the step's drafts are the draft model's for a batch (judged by the trials)
        self._judged = False  # ... and the step tells what drafting gives (every reply had room for a draft)
        self._active = False
        self.set_mode(mode)

    def set_mode(self, mode: str) -> None:
        """Draft as ``mode`` says from the next step on; what was measured is kept."""
        self.mode = mode
        self._active = False
        self.trials.reset()
        self._reason = "off: chosen in the settings" if mode == "off" else "no reply has been written yet"

    def plan(self, decoding: list[Sequence], room: dict[str, int]) -> None:
        """Give each of ``decoding`` (the requests writing replies) its draft for the next step. ``room``: how
        many tokens each may still take (its ``max_tokens`` and the context, less one for the step's own)."""
        for seq in decoding:
            seq.draft, seq.draft_hint = [], []
        self._batch_trial = self._judged = self._probing = False
        if len(decoding) <= 1:
            self.trials.reset()
        if self.mode == "off" or not decoding:
            return
        proposals = {}
        self._sources = {}
        self._forecast = None
        batch_tried = self.uses_draft_model and self.mode == "auto" and len(decoding) > 1  # see .draft_trials
        self._batch_trial = batch_tried and self.trials.drafts(len(decoding), self._model_behind(decoding),
                                                               self.costs.measured(len(decoding)))
        # a trial's steps are judged where every reply has room for a whole draft (not the last tokens of a reply)
        self._judged = all(room.get(seq.request_id, 0) >= FORCED_DRAFT for seq in decoding)
        for seq in decoding:
            draft = self._on_offer(seq, room.get(seq.request_id, 0), model_per_step=not batch_tried)
            if draft:
                proposals[seq.request_id] = (seq, draft)
                self._sources[seq.request_id] = "model" if draft[0] == TO_DRAFT else "lookup"
        if self._batch_trial:
            self._reason = f"auto: {self.trials.describe()}"
            lengths = {rid: len(draft) for rid, (_, draft) in proposals.items()}
        elif self.mode == "auto":
            lengths = self._auto_lengths(proposals, len(decoding))
            if batch_tried:
                self._reason += f"; the draft model: {self.trials.describe()}"
        else:
            lengths = {rid: len(draft) for rid, (_, draft) in proposals.items()}
        for rid, (seq, draft) in proposals.items():
            seq.draft = draft[: lengths.get(rid, 0)]
        self._active = any(seq.draft for seq, _ in proposals.values())

    def _on_offer(self, seq: Sequence, room: int, model_per_step: bool) -> list[int]:
        """The draft on offer for ``seq``, at most ``room`` tokens: the draft model's for every reply of a batch
        trying it; else lookup's, or the draft model's where lookup has none or is kept less often and
        ``model_per_step`` (auto weighs the draft model step by step only for a lone reply)."""
        if self._batch_trial:
            return self._model_draft(seq, min(room, FORCED_DRAFT))
        limit = min(room, MAX_DRAFT if self.mode == "auto" else FORCED_DRAFT)
        lookup = self.proposer.propose(seq.request_id, seq.token_ids, limit)
        if (self.uses_draft_model and model_per_step and limit
                and (self.mode == "draft" or not lookup or self._model_is_better(seq.request_id))):
            return self._model_draft(seq, limit, lookup)
        return lookup

    def _model_draft(self, seq: Sequence, length: int, lookup: list[int] | None = None) -> list[int]:
        """A draft of ``length`` tokens for the draft model to write, with lookup's guess at its first ones
        (``lookup``, else looked up now) as its hint: where the draft model's own next tokens would be the same,
        one pass over the guessed positions writes them all, instead of a pass per token (:mod:`.draft_model`).
        The hint is as long as its tokens' chance of being the draft model's pays for the position each adds to
        the pass (:data:`HINT_ROW_COST`), and at least one token, so that chance stays measured."""
        if lookup is None:
            lookup = self.proposer.propose(seq.request_id, seq.token_ids, length - 1)
        first, later = self._chances(HINTS, seq.request_id)
        wanted, chance = 1, first * later
        while wanted < length - 1 and chance >= HINT_ROW_COST:
            wanted, chance = wanted + 1, chance * later
        seq.draft_hint = lookup[: min(wanted, length - 1)]
        return [TO_DRAFT] * length

    @staticmethod
    def _model_behind(decoding: list[Sequence]) -> int:
        """The most reply tokens the draft model has missed of any of ``decoding`` (a prompt it catches up on
        is not counted: its cost goes with the prompt's). A preempted reply, whose draft KV is computed again from
        its start, counts all its tokens: it holds the batch's trials back until it ends."""
        return max(seq.num_tokens - max(seq.draft_computed, seq.num_prompt_tokens) for seq in decoding)

    @property
    def uses_draft_model(self) -> bool:
        """True where the next drafts come from the draft model (and are written after scheduling)."""
        return self.draft_model is not None and self.mode in ("auto", "draft")

    def _model_is_better(self, request_id: str) -> bool:
        """In auto, whether the draft model's drafts are expected to keep more tokens for this request than
        lookup's (lookup's are free, so they go first until measured worse)."""
        if self.mode != "auto":
            return False
        return self._expected("model", request_id) > self._expected("lookup", request_id)

    def _chances(self, source: str, request_id: str) -> tuple[float, float]:
        """(first, later) for ``source``'s drafts of this request (see :meth:`Acceptance.chances`)."""
        return self._acceptance(source, request_id).chances(self.engine_acceptance[source].chances())

    def _expected(self, source: str, request_id: str) -> float:
        return self._acceptance(source, request_id).expected(FORCED_DRAFT, self.engine_acceptance[source].chances())

    def _auto_lengths(self, proposals: dict[str, tuple[Sequence, list[int]]], batch: int) -> dict[str, int]:
        """Draft lengths for the step (see the module's text): the ``e`` draft tokens most likely to be kept,
        for the ``e`` whose step promises most tokens per second while every reply in it is expected to come
        :data:`MARGIN` faster than in a plain step (so none where a reply has no draft on offer: the others'
        drafts could only slow it); now and then a one-token probe."""
        if not self.costs.known:
            self._reason = "auto: measuring what a step costs"
            return {}
        if not proposals:  # most steps of text that does not repeat: nothing to weigh (planning is per step)
            self._plain_steps += 1
            self._reason = "auto: not drafting (lookup finds nothing to draft)"
            return {}
        margin = MARGIN if batch == 1 else BATCH_MARGIN
        odds = {rid: self._chances(self._sources[rid], rid) for rid in proposals}
        # the chance each draft token is kept; a draft's later tokens never rank before its earlier ones
        chances = sorted(((odds[rid][0] * odds[rid][1] ** j, rid) for rid, (_, draft) in proposals.items()
                          for j in range(len(draft))), reverse=True)
        best, best_gain = self._best_length(proposals, chances, batch, margin) if len(proposals) == batch else (0, 0)
        lengths = dict.fromkeys(proposals, 0)
        for _, rid in chances[:best]:
            lengths[rid] += 1
        if not best and self._plain_steps >= self._probe_every * batch:  # all try one token in one step, so
            lengths = dict.fromkeys(proposals, 1)                          # acceptance stays measured
            self._plain_steps, self._probing = 0, True
        else:
            self._plain_steps = 0 if best else self._plain_steps + 1
            if best:
                self._probe_every = PROBE_EVERY
        drafting = sum(1 for n in lengths.values() if n)
        prior = self.engine_acceptance["model" if "model" in self._sources.values() else "lookup"].rate()
        error = self.calibration.factor(batch)
        lately = f"kept lately: {prior:.0%}" + (f", drafts' steps {error:.2f}x their forecast" if error != 1 else "")
        self._reason = (f"auto: drafting for {drafting} of {batch} replies, {best} tokens (every reply expected "
                        f"{best_gain:.2f}x as fast; {lately})" if best else
                        f"auto: not drafting (no draft makes every reply {margin:.2f}x as fast; {lately})")
        return lengths

    def _best_length(self, proposals: dict[str, tuple[Sequence, list[int]]], chances: list[tuple[float, str]],
                     batch: int, margin: float) -> tuple[int, float]:
        """How many of ``chances`` (every reply's draft tokens, likeliest kept first) the step should take, and the
        gain its slowest reply is expected to see against a plain step: (0, 0) where no count gives ``margin``."""
        plain_step = self.costs.predict(batch)
        best, best_gain = 0, margin
        chose_unmeasured = False  # one row count not measured yet at a time: the smallest that promises most
        expected = dict.fromkeys(proposals, 1.0)  # tokens each reply expects from the step
        tables = {False: self._draft_costs(False, batch), True: self._draft_costs(True, batch)}
        with_model = False  # the step's drafts so far need the draft model's passes
        error = self.calibration.factor(batch)  # how such forecasts came out lately
        tokens = float(batch)  # the step's expected tokens
        for extra, (chance, rid) in enumerate(chances, start=1):
            expected[rid] += chance
            tokens += chance
            with_model = with_model or proposals[rid][1][0] == TO_DRAFT
            costs = tables[with_model]
            unmeasured = not costs.measured(batch + extra)  # a line or a guess predicts it
            if unmeasured and chose_unmeasured:
                continue
            seconds = costs.predict(batch + extra)
            gain = error * min(expected.values()) * plain_step / seconds  # the slowest reply against a plain step
            if gain > best_gain:
                best, best_gain, chose_unmeasured = extra, gain, unmeasured
                self._forecast = (batch, tokens / seconds)
        return (best, best_gain) if best else (0, 0.0)

    def _draft_costs(self, with_model: bool, batch: int) -> StepCosts:
        """What steps of ``batch`` replies with drafts cost, as measured; until then the plain steps' line."""
        costs = (self.model_costs if with_model else self.lookup_costs).get(batch)
        return costs if costs is not None and costs.known else self.costs

    def _acceptance(self, source: str, request_id: str) -> Acceptance:
        key = (source, request_id)
        if key not in self._requests:
            self._requests[key] = Acceptance(REQUEST_DECAY)
        return self._requests[key]

    def record(self, chunks, seconds: float, decode_only: bool, draft_seconds: float = 0.0,
               caught_up: CatchUp = CatchUp.NONE) -> None:
        """Learn from a finished step: its chunks (with their drafts and what was kept) and its time, with the
        ``draft_seconds`` the draft model's passes took (``caught_up``: what they caught up on first, which no
        other step does). ``decode_only``: the step held no prompt work, so its time is a decode step's."""
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
            source = self._sources.get(chunk.seq.request_id, "lookup")
            self._acceptance(source, chunk.seq.request_id).record(len(chunk.draft), chunk.accepted)
            self.engine_acceptance[source].record(len(chunk.draft), chunk.accepted)
            hint = chunk.seq.draft_hint  # what the draft model checked of lookup's guess, and wrote the same
            if hint:
                agreed = accepted_length(hint, chunk.draft)
                self._acceptance(HINTS, chunk.seq.request_id).record(len(hint), agreed)
                self.engine_acceptance[HINTS].record(len(hint), agreed)
        if self._probing:
            kept = any(chunk.accepted for chunk in chunks)
            self._probe_every = PROBE_EVERY if kept else min(2 * self._probe_every, PROBE_BACKOFF_MOST * PROBE_EVERY)
        seconds += draft_seconds
        # a trial bears its catching up on the replies it sat out, never on a prompt (see CatchUp)
        if (self._batch_trial and self._judged and decode_only and self.costs.known
                and caught_up is not CatchUp.PROMPT and (self.trials.starting or caught_up is CatchUp.NONE)):
            self.trials.record(emitted, seconds, self.costs.predict(len(chunks)) / len(chunks))
        if caught_up is not CatchUp.NONE or not decode_only or (draft_seconds and not drafted_rows) or seconds <= 0:
            return  # prompt work in the step, or the draft model catching up: not a decode step's cost
        if drafted_rows and self._forecast is not None:
            replies, forecast_rate = self._forecast
            self.calibration.record(replies, forecast_rate, emitted / seconds)
        if drafted_rows and self.costs.known:
            plain = (rows - drafted_rows) / self.costs.predict(rows - drafted_rows)
            ratio = (emitted / seconds) / plain
            self._speedup = ratio if self._speedup is None else 0.9 * self._speedup + 0.1 * ratio
        if not drafted_rows:
            self.costs.observe(rows, seconds)
            self.calibration.age(len(chunks))
        else:
            tables = self.model_costs if draft_seconds else self.lookup_costs
            tables.setdefault(len(chunks), StepCosts(self.costs)).observe(rows, seconds)

    def forget_text(self) -> None:
        """Drop the finished sequences lookup drafts from (a benchmark's repeated rounds would otherwise draft
        each reply from the same reply of the round before)."""
        self.proposer = NgramProposer()

    def finish(self, request_id: str) -> None:
        self.proposer.finish(request_id)
        for source in (*SOURCES, HINTS):
            self._requests.pop((source, request_id), None)

    def stats(self, draft_memory_bytes: int = 0) -> SpeculationStats:
        reason = self._reason
        if self.mode == "ngram":
            reason = f"n-gram: forced in the settings, {FORCED_DRAFT} tokens a draft where lookup finds some"
        elif self.mode == "draft":
            reason = f"draft model: forced in the settings, up to {FORCED_DRAFT} tokens a draft from {self.draft_model}"
        elif self.uses_draft_model:
            reason = reason.replace("auto:", f"auto ({self.draft_model}):", 1)
        return SpeculationStats(self.mode, self._active, reason, self.num_drafts_total, self.draft_tokens_total,
                                self.accepted_total, self._speedup, self.draft_model or "", draft_memory_bytes)
