"""Drafts for speculative decoding's tests: drafts that are right for a while and then wrong, known in advance.

It proposes what a plain run wrote next, each token spoilt with some probability, so the verification, not a
lookup, is what a test exercises.
"""

from __future__ import annotations

import random


class OracleProposer:
    """Proposes what the plain run wrote next, each token spoilt with probability ``spoil``."""

    def __init__(self, references: list[list[int]], spoil: float = 0.3, seed: int = 0) -> None:
        self.references = references
        self.spoil = spoil
        self.random = random.Random(seed)
        self.proposed = 0

    def propose(self, request_id: str, tokens: list[int], length: int) -> list[int]:
        for reference in self.references:
            if reference[: len(tokens)] == tokens:
                draft = reference[len(tokens) : len(tokens) + length]
                draft = [t + 1 if self.random.random() < self.spoil else t for t in draft]
                self.proposed += len(draft)
                return draft
        return []

    def finish(self, request_id: str) -> None:
        pass


def with_oracle(engine, plain, prompts, **kwargs) -> OracleProposer:
    """Give ``engine`` an oracle that knows ``plain``'s replies to ``prompts``."""
    references = [engine.encode_prompt(p) + list(o.token_ids) for p, o in zip(prompts, plain, strict=True)]
    oracle = OracleProposer(references, **kwargs)
    engine.speculator.proposer = oracle
    return oracle
