"""Whether the draft model drafts for a batch of replies, found by trying it (speculative decoding in ``auto``,
:mod:`.speculation`).

For a single reply the speculator prices each step's draft from measured step costs: the draft model is a token
or two behind it at most, and one reply's steps are cheap to learn. In a batch that forecast was poor: the draft
model's passes follow the longest draft, the check's rows cost what the linear kernels make them cost at that
width, and a draft model that sat out a stretch of plain steps must first catch up on every reply's missed
tokens; four chats' forecasts came out at 0.4-1.3x, and auto stayed at 1.04-1.14x of plain decoding where forced
drafts gave 1.6x. So a batch tries it instead: after a stretch of plain steps every reply drafts with the draft
model, and after :data:`TRIAL_STEPS` drafted steps their pace (tokens over the steps' time, the draft model's
passes included) is set against what plain steps of the same batches would have taken for those tokens. Where it
is :data:`KEEP_MARGIN` faster the batch goes on drafting, watched the same way step by step, and stops as soon as
it falls below. A trial that lost makes the next one wait twice as long, so a batch whose draft model does not pay
spends little on trials. (The steps in which the draft model catches up on what it missed are left out of the
pace: a cost of starting, bounded by the wait before each trial.)
"""

from __future__ import annotations

TRIAL_STEPS = 4  # drafted steps a trial runs before it is judged
FIRST_WAIT = 32  # plain steps before a batch's first trial, and after drafting that paid stops
MAX_WAIT = 1024  # the most plain steps between trials that lost
KEEP_MARGIN = 1.1  # drafted steps must come this much faster than plain ones: step times are noisy
PACE_DECAY = 0.8  # recent steps weigh most (a quoted passage ends; the machine's load changes)


class BatchTrials:
    """Plain steps and trials of the draft model for the replies of a batch, and the pace each trial gave."""

    def __init__(self) -> None:
        self.drafting = False
        self._wait = FIRST_WAIT
        self._plain_steps = 0
        self._paid = False  # a judgement of the present drafting run found it faster
        self._plain_seconds = self._seconds = 0.0  # (decayed) what plain steps would have taken, what it took
        self._judged_steps = 0
        self.pace: float | None = None  # the drafted steps' pace over plain steps', as last judged

    def drafts(self) -> bool:
        """Whether the next step of a batch drafts with the draft model; a step that does not counts towards the
        next trial."""
        if not self.drafting:
            self._plain_steps += 1
            if self._plain_steps > self._wait:
                self.drafting, self._paid = True, False
                self._plain_seconds = self._seconds = 0.0
                self._judged_steps = 0
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
            self._paid = True
            return
        self.drafting, self._plain_steps = False, 0
        self._wait = FIRST_WAIT if self._paid else min(MAX_WAIT, 2 * self._wait)

    def describe(self, batch: int) -> str:
        pace = "" if self.pace is None else f"{self.pace:.2f}x a plain step's pace lately"
        if self.drafting:
            return (f"drafting with the draft model for every reply of {batch}"
                    + (f" ({pace})" if pace and self._paid else ": trying it"))
        left = max(0, self._wait - self._plain_steps + 1)
        return (f"not drafting for {batch} replies" + (f" (the draft model's steps came {pace})" if pace else "")
                + f"; its next trial in {left} steps")
