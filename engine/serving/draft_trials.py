"""Whether the draft model drafts for a batch of replies, found by trying it (speculative decoding in ``auto``,
:mod:`.speculation`).

For a single reply the speculator prices each step's draft from measured step costs: the draft model is a token
or two behind it at most, and one reply's steps are cheap to learn. In a batch that forecast was poor: the draft
model's passes follow the longest draft, the check's rows cost what the linear kernels make them cost at that
width, and a draft model that sat out a stretch of plain steps must first catch up on every reply's missed
tokens; four chats' forecasts came out at 0.4-1.3x, and auto stayed at 1.04-1.14x of plain decoding where forced
drafts gave 1.6x. So a batch tries it instead: after :data:`FIRST_WAIT` plain steps (the plain steps' cost at the
batch measured, and little for the draft model to catch up on; none where that cost is known) every reply drafts
with the draft model, and after :data:`TRIAL_STEPS` drafted steps their pace (tokens over the steps' time, the
draft model's passes and its catching up included) is set against what plain steps of the same batches would
have taken for those tokens. Where it is :data:`KEEP_MARGIN` faster the batch goes on drafting, watched the same
way step by step, and stops as soon as it falls below.

Trying is not free: the draft model catches up on every reply's tokens it missed, which costs about a third of
the plain steps it sat out at thirty-two chats of the float32 default model (a pass of the int4 copy over one
position takes a third of what a plain step spends on one reply), and a losing trial's steps are slower than
plain ones. So a trial starts only where the draft model is close behind every reply (:data:`CLOSE_BEHIND`
tokens of its reply: a batch that has just started, or has just stopped drafting), and where
:data:`LOSSES_BEFORE_WAIT` trials in a row never paid, a batch of that many replies or more is not tried again for
:data:`LOST_WAIT` plain steps while the batch lasts; fewer replies may try after the first wait. A first losing
trial, and drafting that paid and then stopped, try again after the first wait: a few slow steps on a busy
machine, or plain steps' cost measured in a faster minute, look like drafts that do not pay (one such trial in a
bench run of four chats that gained 1.35x with forced drafts kept the batch plain for that workload and the next:
0.89x and 1.04x of off).
"""

from __future__ import annotations

import enum


class CatchUp(enum.Enum):
    """What the draft model's first pass of a step computed besides each reply's last token and the one before."""

    NONE = "none"  # nothing more: its usual pass
    REPLIES = "replies"  # reply tokens it sat out (plain steps it took no part in): a trial's own cost
    PROMPT = "prompt"  # positions of a prompt it had not computed: the prompt's cost, which drafting pays once
    # per request whenever it starts (a new batch's first trial paid it at 0.3 s for four chats of the rewrite,
    # and was judged at 0.83x where its later steps came 1.15-1.4x as fast), so never judged as a trial's


TRIAL_STEPS = 4  # drafted steps a trial runs before it is judged
FIRST_WAIT = 8  # plain steps before a batch tries the draft model
LOST_WAIT = 512  # ... where a batch of as many replies or fewer had trials that never paid
LOSSES_BEFORE_WAIT = 2  # trials in a row that never paid before the long wait
# reply tokens the draft model may have missed for a batch to try it: the first wait's plain steps, and as many
# again that lookup's drafts kept meanwhile (with the wait's alone, a traced run of four chats of the rewrite whose
# first trial lost at 1.09x kept lookup's drafts through the wait, fell too far ahead and never tried again)
CLOSE_BEHIND = 2 * FIRST_WAIT + 2
KEEP_MARGIN = 1.1  # drafted steps must come this much faster than plain ones: step times are noisy
PACE_DECAY = 0.8  # recent steps weigh most (a quoted passage ends; the machine's load changes)


class BatchTrials:
    """Plain steps and trials of the draft model for the replies of a batch, and the pace each trial gave."""

    def __init__(self) -> None:
        self.drafting = False
        self._plain_steps = 0
        self._batch, self._plain_measured = 0, False  # the latest step's replies, and whether their plain
        # steps were measured (what describe() speaks of)
        self._lost_at: int | None = None  # the fewest replies whose trial lost lately
        self._paid = False  # the present drafting run was judged faster at least once
        self._stopped = False  # a run that paid stopped, or a first trial lost: the next waits the first steps
        self._losses = 0  # trials in a row that never paid
        self._plain_seconds = self._seconds = 0.0  # (decayed) what plain steps would have taken, what it took
        self._judged_steps = 0
        self.pace: float | None = None  # the drafted steps' pace over plain steps', as last judged

    def reset(self) -> None:
        """The batch ended (one reply left, or none) or the mode changed: the next batch waits the first plain
        steps, and is judged afresh (the long wait was the batch's: its plain steps rarely reach it, and a
        bench's four chats of the rewrite that lost twice kept the summary's and the story's batches after it
        plain, 1.13x and 1.08x of off where forced drafts gave 1.55x and 1.67x)."""
        self.drafting, self._plain_steps, self._stopped = False, 0, False
        self._lost_at, self._losses = None, 0

    @property
    def starting(self) -> bool:
        """A trial is under way and not judged yet: its steps bear the draft model's catching up."""
        return self.drafting and self._judged_steps < TRIAL_STEPS

    def wait(self, batch: int, plain_measured: bool = False) -> int:
        """Plain steps before ``batch`` replies try the draft model: none where plain steps of as many replies
        are measured already (a new batch of the same size drafts from its first step), unless it lost there."""
        if self._lost_at is not None and batch >= self._lost_at:
            return LOST_WAIT
        return 0 if plain_measured and not self._stopped else FIRST_WAIT

    def drafts(self, batch: int, behind: int, plain_measured: bool = False) -> bool:
        """Whether the next step of ``batch`` replies drafts with the draft model, which has missed at most
        ``behind`` tokens of each reply; a step that does not counts towards the next trial. ``plain_measured``:
        what plain steps of ``batch`` replies take is known."""
        if not self.drafting:
            self._plain_steps += 1
            if self._plain_steps > self.wait(batch, plain_measured) and behind <= CLOSE_BEHIND:
                self.drafting, self._paid, self._stopped = True, False, False
                self._plain_seconds = self._seconds = 0.0
                self._judged_steps = 0
        self._batch, self._plain_measured = batch, plain_measured
        return self.drafting

    def record(self, tokens: int, seconds: float, plain_seconds_per_token: float) -> None:
        """A drafted step gave ``tokens`` in ``seconds`` (the draft model's passes included), where plain steps of
        the batch take ``plain_seconds_per_token``."""
        self._plain_seconds = PACE_DECAY * self._plain_seconds + tokens * plain_seconds_per_token
        self._seconds = PACE_DECAY * self._seconds + seconds
        self._judged_steps += 1
        if self._judged_steps < TRIAL_STEPS:
            return
        self.pace = self._plain_seconds / self._seconds
        if self.pace >= KEEP_MARGIN:
            self._paid, self._losses = True, 0
            if self._lost_at is not None and self._batch >= self._lost_at:
                self._lost_at = None  # it pays again where it lost
            return
        self.drafting, self._plain_steps = False, 0
        self._losses += 0 if self._paid else 1
        if self._losses < LOSSES_BEFORE_WAIT:
            self._stopped = True
        else:
            self._lost_at = self._batch if self._lost_at is None else min(self._lost_at, self._batch)

    def describe(self) -> str:
        """What the latest step did, and why, in words."""
        batch = self._batch
        pace = "" if self.pace is None else f"{self.pace:.2f}x a plain step's pace lately"
        if self.drafting:
            return (f"drafting with the draft model for every reply of {batch}"
                    + (f" ({pace})" if pace and self._judged_steps >= TRIAL_STEPS else ": trying it"))
        left = max(0, self.wait(batch, self._plain_measured) - self._plain_steps + 1)
        when = f"in {left} steps" if left else "with replies it has not fallen behind"
        return (f"not drafting for {batch} replies" + (f" (the draft model's steps came {pace})" if pace else "")
                + f"; its next trial {when}")
