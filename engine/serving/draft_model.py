"""A draft model: a second, smaller or more quantised model that proposes the next tokens of a reply, for the
serving model to check in one step (speculative decoding, :mod:`.speculation`).

It is loaded beside the serving model in the same engine and shares its pool: its keys and values live in
tensors of their own, indexed by the same block tables (positions are the same), so a request's blocks hold
both models' KV, and freeing, preempting or caching a block does it for both. What the draft has computed is
tracked per request (``Sequence.draft_computed``) and per block (``Block.draft_ok``, set once the draft's KV of
the whole block is in place): a prompt whose cached prefix the draft computed before is not computed again,
and where it did not (blocks read from the disk tier, steps decoded without a draft) the draft catches up in
its next pass. The draft's KV is only ever a guess's input: the serving model checks every drafted token, so
a stale draft costs acceptance, never correctness.

Drafts are greedy: the draft model's most likely token at each position, one pass per drafted token, batched over
the replies that draft. Where lookup guessed the draft's first tokens (its hint, ``Sequence.draft_hint``), the first
pass also computes the positions after the reply's last token on the guessed tokens: as far as the draft model's own
choice at each position is the guessed token, the guess was its draft, and one pass wrote that much of it; its
choice after the last agreeing position is the draft's next token, and later passes go on from there. The draft is
the same either way; a rejected guess costs its positions in the pass. (Stopping a draft where the draft model is
unsure, as llama.cpp's ``p_min`` does, was measured here: with a 0.3 cut, drafts the serving model kept 96% of came
out half as long, and replies slower.)
"""

from __future__ import annotations

import dataclasses
import logging
from itertools import accumulate

import torch

from ..config import EngineConfig
from ..errors import ModelLoadError
from ..models.draft_candidates import tokenizer_mismatch
from ..models.loader import LoadedModel, Progress, load_model
from ..step import attention
from ..step.attention import SequenceSlice, build_metadata
from ..step.cuda_graphs import GraphLimits, position_rows
from ..step.native_decoder import NativeDecoder
from ..step.runner import ModelRunner
from ..step.transfer import to_device
from .block_manager import BlockManager
from .draft_trials import CatchUp
from .kv_cache import KVCache, KVShape
from .scheduler import Chunk
from .sequence import Sequence
from .speculation import accepted_length

log = logging.getLogger(__name__)

# a pass's positions of one reply go as decode rows where it catches up on this many or fewer (after a draft it
# wrote was all kept: two), its hint's with them; else as one chunk (a prompt it has not seen)
ROWS_UP_TO = 4


def draft_config(config: EngineConfig) -> EngineConfig:
    """The configuration the draft model loads with: the serving one's, with the draft's model and quantisation."""
    return dataclasses.replace(config, model=config.draft_model, quantization=config.draft_quantization,
                               draft_model=None, speculation="off")


def load_draft_model(config: EngineConfig, device: torch.device, tokenizer, progress: Progress | None = None
                     ) -> LoadedModel:
    """Load ``config``'s draft model; refuses, in words, one whose tokens do not mean the serving model's
    (``tokenizer``)."""
    loaded = load_model(draft_config(config), device, attention.ATTENTION_NAME, progress)
    problem = tokenizer_mismatch(tokenizer, loaded.tokenizer)
    if problem:
        raise ModelLoadError(f"{loaded.source.name} cannot draft for this model: {problem}")
    return loaded


@dataclasses.dataclass(slots=True)
class _Row:
    """One reply in a draft pass: positions ``[start, end)`` computed on ``tokens``, then a position for each
    of ``hint``'s tokens; the draft's length wanted."""

    index: int  # the reply's chunk in the step
    seq: Sequence
    start: int
    tokens: list[int]
    length: int
    hint: list[int] = dataclasses.field(default_factory=list)

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


class DraftModel:
    """The draft model, its KV tensors in the serving model's pool, and the passes that write drafts."""

    def __init__(self, loaded: LoadedModel, pool: KVCache, shape: KVShape, backend: str, vocab_size: int,
                 graph_limits: GraphLimits | None = None, serving_rounds_activations: bool = True) -> None:
        """``loaded`` (see :func:`load_draft_model`) with KV tensors of ``shape`` beside every block of the serving
        model's ``pool``; ``vocab_size``: the serving model's; ``graph_limits``: its passes replay CUDA graphs
        (the pool has the scratch block they need); ``serving_rounds_activations``: whether the serving model's
        linear layers round their activations to 8 bits, as a 4-bit draft's do.

        Where they don't (a float serving model), the draft's 8-bit rounding is a difference the serving model
        does not have: for the float32 default model and its own 4-bit copy, whose weights are the same numbers,
        the only one. So a pass of one reply (a lone chat's prompt, draft and hint) rounds them to about 15 bits
        (``NativeDecoder.fine_activations``): each row's remainder goes through as a second row, which costs
        little where a pass reads its weights from memory. On the summary at one chat drafts were then kept 159
        of 159 times against 156 of 173. A pass of several replies keeps 8 bits: at four chats the doubled rows
        cost more than the drafts kept gave (0.89-0.96x)."""
        self.loaded = loaded
        self.block_size = pool.block_size
        self.kv_cache = KVCache(shape, pool.num_blocks, pool.block_size, loaded.device, pool.reserved_blocks)
        self.runner = ModelRunner(loaded.model, self.kv_cache, loaded.device, backend, graph_limits)
        self.vocab_size = vocab_size  # the serving model's: a draft token past it could not be checked
        fine = not serving_rounds_activations and isinstance(self.runner.lean, NativeDecoder)
        self._fine_decoder = self.runner.lean if fine else None

    @property
    def memory_bytes(self) -> int:
        """The draft's weights and its KV tensors."""
        return self.loaded.memory_bytes + self.kv_cache.memory_bytes

    @property
    def name(self) -> str:
        return f"{self.loaded.source.name} ({self.loaded.quantization})"

    def close(self) -> None:
        self.runner.close()

    # -- drafting -----------------------------------------------------------------------------------

    @torch.inference_mode()
    def fill(self, chunks: list[Chunk], blocks: BlockManager, budget: int) -> CatchUp:
        """Write the draft of each of ``chunks`` in place, as long as its placeholder (what the step has room for,
        see :meth:`.scheduler.Scheduler._schedule_decodes`) or shorter: greedy tokens of the draft model, after
        the positions it has not computed yet. ``budget``: positions the first pass may take in all; a reply
        further behind than what is left catches up part of the way in this step, without a draft. Returns what
        the first pass computed beyond each reply's last token and the one before (:class:`.draft_trials.CatchUp`)."""
        rows = []
        for index, chunk in enumerate(chunks):
            seq = chunk.seq
            start = self._computed(seq, blocks)
            end = min(chunk.start + 1, start + max(budget, 0))
            budget -= end - start
            length = len(chunk.draft) if end == chunk.start + 1 else 0
            seq.draft_hint = seq.draft_hint[: max(length - 1, 0)]  # a draft's last token is never computed on
            rows.append(_Row(index, seq, start, seq.token_ids[start:end], length, seq.draft_hint))
        drafts = self._draft([row for row in rows if row.end > row.start])
        for chunk, row in zip(chunks, rows, strict=True):
            chunk.draft = tuple(drafts.get(row.index, ()))
            chunk.num_tokens = 1 + len(chunk.draft)
        behind = [row for row in rows if row.end - row.start > 2]
        if any(row.start < row.seq.num_prompt_tokens for row in behind):
            return CatchUp.PROMPT
        return CatchUp.REPLIES if behind else CatchUp.NONE

    def _computed(self, seq: Sequence, blocks: BlockManager) -> int:
        """Positions of ``seq`` whose draft KV is in place: what the draft computed for it, or the blocks its
        cached prefix brought that the draft computed for another request."""
        if seq.draft_computed + self.block_size > seq.num_computed_tokens:  # no whole block to look for
            return min(seq.draft_computed, seq.num_computed_tokens)
        ok = 0
        for block_id in seq.block_table:
            if not blocks.blocks[block_id].draft_ok:
                break
            ok += 1
        return min(max(seq.draft_computed, ok * self.block_size), seq.num_computed_tokens)

    def _draft(self, rows: list[_Row]) -> dict[int, list[int]]:
        """One pass per drafted token: the first over each reply's positions the draft has not computed, up to
        its last token, and its hint's; each later one over the token the pass before gave."""
        drafts: dict[int, list[int]] = {}
        while rows:
            choices = self._pass(rows)
            next_rows = []
            for row, chosen in zip(rows, choices, strict=True):
                draft = drafts.setdefault(row.index, [])
                agreed = accepted_length(row.hint, chosen)
                row.seq.draft_computed = row.end + agreed  # positions after a rejected hint token are no draft's
                draft += chosen[: min(agreed + 1, row.length - len(draft))]
                if len(draft) < row.length:
                    next_rows.append(_Row(row.index, row.seq, row.seq.draft_computed, [draft[-1]], row.length))
            rows = next_rows
        return drafts

    def _pass(self, rows: list[_Row]) -> list[list[int]]:
        """The draft model over each row's positions; its greedy choice after the row's last token and after each
        of its hint's tokens."""
        inputs = [row.tokens + row.hint for row in rows]
        if self._fine_decoder is not None:
            self._fine_decoder.fine_activations = len(rows) == 1
        ends = list(accumulate(map(len, inputs)))
        wanted = torch.tensor([i for row, end in zip(rows, ends, strict=True)
                               for i in range(end - 1 - len(row.hint), end)], dtype=torch.long)
        logits = self._replayed(rows, inputs, wanted)
        if logits is None:
            logits = self._eager(rows, inputs, wanted)
        chosen = iter(logits[:, : self.vocab_size].argmax(dim=-1).tolist())
        return [[next(chosen) for _ in range(1 + len(row.hint))] for row in rows]

    def _replayed(self, rows: list[_Row], inputs: list[list[int]], wanted: torch.Tensor) -> torch.Tensor | None:
        """The ``wanted`` positions' logits from a CUDA graph, every position a decode row; None where the pass
        does not fit one (a prompt to catch up), or no graph can run it."""
        graphs = self.runner.graphs
        if graphs is None or not graphs.fits(sum(map(len, inputs))):
            return None
        decode = [position for row, tokens in zip(rows, inputs, strict=True)
                  for position in position_rows(tokens, row.start, row.seq.block_table)]
        logits = graphs.run_rows(decode)
        if logits is None:
            return None
        return logits[wanted.to(logits.device)]

    def _eager(self, rows: list[_Row], inputs: list[list[int]], wanted: torch.Tensor) -> torch.Tensor:
        ids: list[int] = []
        slices: list[SequenceSlice] = []
        for row, tokens in zip(rows, inputs, strict=True):
            if self.runner.drafts_as_rows and len(row.tokens) <= ROWS_UP_TO:  # the native one-call decode step
                slices += [SequenceSlice(len(ids) + j, row.start + j, row.start + j + 1, row.seq.block_table)
                           for j in range(len(tokens))]
            else:
                slices.append(SequenceSlice(len(ids), row.start, row.start + len(tokens), row.seq.block_table))
            ids.extend(tokens)
        meta = build_metadata(self.kv_cache, slices, self.loaded.device, self.runner.backend, self.runner.dtype)
        return self.runner.logits(to_device(torch.tensor(ids), self.loaded.device), meta,
                                  to_device(wanted, self.loaded.device))

    def after_step(self, chunks: list[Chunk], blocks: BlockManager) -> None:
        """What the serving model kept of each draft: the draft's KV is right up to the first rejected token
        (each drafted position was computed on the token before it), and every full block below that holds it."""
        for chunk in chunks:
            seq = chunk.seq
            if chunk.draft:
                seq.draft_computed = min(seq.draft_computed, chunk.kept_end)
            index = min(seq.draft_computed // self.block_size, len(seq.block_table)) - 1
            while index >= 0 and not blocks.blocks[seq.block_table[index]].draft_ok:
                blocks.blocks[seq.block_table[index]].draft_ok = True
                index -= 1

