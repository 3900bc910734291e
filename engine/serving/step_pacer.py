"""Stall-free batching: how much prompt work a step may take beside the replies being written. Pure Python.

A step that prefills a whole 2,000-token prompt stops every running reply for as long as it takes (7.6 s on a
2-core CPU). So while anything decodes, each step's prompt chunks are sized to keep the step within a latency
target, from the engine's own recent steps: a decode-only step costs ``base + per_row * rows``, and prompt work
adds ``per_token * n + per_context * n * (start + n / 2)`` for a chunk of ``n`` tokens starting at ``start``
(each token attends to everything before it, so later chunks cost more). Both are fitted by least squares to
the last steps, so the model follows a machine that gets busier or quieter. With nothing decoding, a
step takes the whole token budget: nobody is waiting on a gap.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

CPU_TARGET_S = 0.150
GPU_TARGET_S = 0.050
WINDOW = 64  # the steps a cost is fitted to
MIN_CHUNK = 16  # prompt tokens a step always takes, so a prompt moves on even beside a slow decode


class LeastSquares:
    """``y ~ a * x0 + b * x1``, fitted to the last :data:`WINDOW` samples in closed form: a machine that gets busier
    or quieter is followed within a window. Costs are never negative: where the two-term fit says so (the samples
    cannot tell the terms apart: every step alike), it falls back to the first term alone."""

    def __init__(self, prior: list[float]) -> None:
        self.theta = list(prior)
        self._samples: deque[tuple[float, float, float]] = deque(maxlen=WINDOW)

    @property
    def samples(self) -> int:
        return len(self._samples)

    def predict(self, x: list[float]) -> float:
        return self.theta[0] * x[0] + self.theta[1] * x[1]

    def observe(self, x: list[float], y: float) -> None:
        self._samples.append((x[0], x[1], y))
        self.theta = self._fit() or self.theta

    def _fit(self) -> list[float] | None:
        s00 = sum(a * a for a, _, _ in self._samples)
        s01 = sum(a * b for a, b, _ in self._samples)
        s11 = sum(b * b for _, b, _ in self._samples)
        s0y = sum(a * y for a, _, y in self._samples)
        s1y = sum(b * y for _, b, y in self._samples)
        det = s00 * s11 - s01 * s01
        if det > 1e-9 * max(s00 * s11, 1e-300):
            a, b = (s0y * s11 - s1y * s01) / det, (s1y * s00 - s0y * s01) / det
            if a >= 0 and b >= 0:
                return [a, b]
        return [max(0.0, s0y / s00), 0.0] if s00 > 0 else None


CONTEXT_UNIT = 1000.0  # token pairs per unit of the context feature, so both features have like sizes


def prompt_features(chunks: list[tuple[int, int]]) -> list[float]:
    """``[tokens, tokens x the context they attend to / CONTEXT_UNIT]`` of chunks given as ``(start, tokens)``."""
    return [float(sum(n for _, n in chunks)), sum(n * (start + n / 2) for start, n in chunks) / CONTEXT_UNIT]


@dataclass(slots=True)
class Allowance:
    """What one step may still spend on prompt work, in seconds; unlimited when nothing decodes."""

    seconds: float
    per_token: float
    per_context: float
    unlimited: bool = False
    taken: list[tuple[int, int]] = field(default_factory=list)

    def take(self, start: int, wanted: int) -> int:
        """How many of ``wanted`` prompt tokens from position ``start`` fit; they are counted as spent."""
        if self.unlimited or wanted <= 0:
            return max(wanted, 0)
        fits = self._fits(start)
        granted = min(wanted, max(fits, MIN_CHUNK if not self.taken else 0))
        if granted:
            self.seconds -= self.per_token * granted + self.per_context * granted * (start + granted / 2)
            self.taken.append((start, granted))
        return granted

    def _fits(self, start: int) -> int:
        """The largest ``n`` with ``per_token * n + per_context * n * (start + n / 2) <= seconds``."""
        if self.seconds <= 0:
            return 0
        linear = self.per_token + self.per_context * start
        if self.per_context <= 0:
            return int(self.seconds / linear) if linear > 0 else 1 << 30
        half = self.per_context / 2
        return int((-linear + math.sqrt(linear * linear + 4 * half * self.seconds)) / (2 * half))


class StepPacer:
    """Learns what steps cost and hands each step its :class:`Allowance` for prompt work."""

    def __init__(self, target_s: float) -> None:
        if not target_s > 0:
            raise ValueError("the step latency target must be a positive number of seconds")
        self.target_s = target_s
        self.decode = LeastSquares([0.0, 0.0])  # [1, rows]
        self.prompt = LeastSquares([1e-3, 0.0])  # [tokens, tokens x context]: a guess until the first prompt step

    def allowance(self, decode_rows: int) -> Allowance:
        """The prompt work one step may take beside ``decode_rows`` decoding replies."""
        per_token, per_context = self.prompt.theta[0], self.prompt.theta[1] / CONTEXT_UNIT
        if decode_rows == 0:
            return Allowance(math.inf, per_token, per_context, unlimited=True)
        left = self.target_s - self.decode.predict([1.0, float(decode_rows)])
        return Allowance(left, per_token, per_context)

    def observe(self, decode_rows: int, prompt_chunks: list[tuple[int, int]], seconds: float) -> None:
        """Learn from one finished step: its decode rows, its prompt chunks as ``(start, tokens)``, its time."""
        rows = [1.0, float(decode_rows)]
        if not prompt_chunks:
            self.decode.observe(rows, seconds)
            return
        decode_part = self.decode.predict(rows) if decode_rows and self.decode.samples else 0.0
        self.prompt.observe(prompt_features(prompt_chunks), max(0.0, seconds - decode_part))
