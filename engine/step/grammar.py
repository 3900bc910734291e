"""Structured output: each constrained reply's grammar, and the masks that keep sampling inside it.

llguidance does the grammar work (picked by measurement on a 2-core CPU against xgrammar: about 1-2 ms to compile
a schema against 10-30, masks within 2.5x of xgrammar's speed, and a schema keyword it cannot enforce refused by
name rather than ignored). A :class:`Grammars` per model holds its tokenizer as llguidance sees it (built on first
use, half a second) and compiles each request's :class:`~engine.sampling_params.Structure` into a
:class:`Constraint`: a matcher that is told every token the reply takes and gives the mask of the tokens allowed
next. Masks of a step's constrained rows are filled in one call (native threads, without the GIL) and applied as
a bias of 0 or -inf per token, so constrained and free replies share the step.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import torch

from ..sampling_params import Structure

# byte value -> the bias of its eight tokens (bit j of the byte: token j allowed, 0; else -inf)
_BIAS_OF_BYTE = torch.from_numpy(np.where(
    np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little"), np.float32(0),
    np.float32(-np.inf)).astype(np.float32))
# JSON without free whitespace between tokens: a small model left free to write spaces and newlines can loop there
JSON_DEFAULTS = {"whitespace_flexible": False}


class GrammarError(ValueError):
    """A structure that cannot be enforced: its message names what is wrong (the endpoint's 400)."""


class Grammars:
    """One model's grammar compiler: ``constraint(structure)`` for each constrained request."""

    def __init__(self, tokenizer, vocab_size: int, eos_token_id: int) -> None:
        self._hf_tokenizer, self.vocab_size, self.eos_token_id = tokenizer, vocab_size, eos_token_id
        self._tokenizer = None
        self._lock = threading.Lock()

    def constraint(self, structure: Structure) -> Constraint:
        """A fresh matcher for ``structure``; :class:`GrammarError` saying why where it cannot be enforced. Safe
        to call from any thread (requests are checked before they reach the engine thread)."""
        import llguidance

        grammar = _grammar(llguidance.LLMatcher, structure)
        tokenizer = self._llg_tokenizer()
        problem = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if problem:
            raise GrammarError(f"the {_named(structure)} cannot be enforced: {problem}")
        return Constraint(llguidance.LLMatcher(tokenizer, grammar))

    def _llg_tokenizer(self):
        with self._lock:
            if self._tokenizer is None:
                import llguidance.hf

                self._tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=self.vocab_size,
                                                               eos_token=self.eos_token_id)
            return self._tokenizer



class Constraint:
    """One reply's place in its grammar."""

    def __init__(self, matcher) -> None:
        self.matcher = matcher

    def accept(self, token: int) -> bool:
        """Take the reply's next token; False where the grammar does not allow it (the matcher then stays in
        error: the reply ends)."""
        return bool(self.matcher.consume_token(token))

    @property
    def done(self) -> bool:
        """The reply is complete: the grammar allows nothing more but the end."""
        return bool(self.matcher.is_stopped())

    @property
    def error(self) -> str:
        return self.matcher.get_error() or ""


_executor = None  # llguidance's threads, which fill a step's masks together


def fill_masks(constraints: list[Constraint], vocab_size: int) -> torch.Tensor:
    """The masks of ``constraints`` (one row each: int32 words, bit ``t % 32`` of word ``t // 32`` set where token
    ``t`` is allowed), filled in one call on llguidance's threads (without the GIL)."""
    global _executor
    import llguidance
    import llguidance.numpy  # its torch helpers would script functions at import (TorchScript, deprecated)

    if _executor is None:
        _executor = llguidance.LLExecutor(num_threads=2)
    masks = llguidance.numpy.allocate_token_bitmask(len(constraints), vocab_size)
    llguidance.numpy.fill_next_token_bitmask_par(_executor, [(c.matcher, i) for i, c in enumerate(constraints)],
                                                 masks)
    return torch.from_numpy(masks)


def apply_masks(logits: torch.Tensor, rows: list[int], masks: torch.Tensor) -> None:
    """Forbid, in place, every token of ``logits``' ``rows`` that its mask (``masks``' row of the same place)
    does not allow; the logits' other rows are left as they are."""
    if not rows:
        return
    vocab = logits.shape[-1]
    bias = _BIAS_OF_BYTE.index_select(0, masks.view(torch.uint8).reshape(-1).long()).view(len(rows), -1)[:, :vocab]
    index = torch.tensor(rows, device=logits.device)
    logits.index_add_(0, index, bias.to(logits.device, logits.dtype))


def _grammar(matcher_type, structure: Structure) -> str:
    try:
        if structure.kind == "json":
            return matcher_type.grammar_from_json_schema({"type": "object"}, defaults=JSON_DEFAULTS)
        if structure.kind == "json_schema":
            return matcher_type.grammar_from_json_schema(json.dumps(structure.spec), defaults=JSON_DEFAULTS)
        if structure.kind == "regex":
            return matcher_type.grammar_from_regex(structure.spec)
        return matcher_type.grammar_from_lark(structure.spec)
    except (ValueError, TypeError, RuntimeError) as exc:
        raise GrammarError(f"the {_named(structure)} cannot be read: {exc}") from None


def _named(structure: Structure) -> str:
    return {"json": "JSON format", "json_schema": "JSON schema", "regex": "regular expression",
            "grammar": "grammar"}[structure.kind]
