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

Drafts are greedy: the draft model's most likely token at each position, one pass per drafted token, batched
over the replies that draft. (Stopping a draft where the draft model is unsure, as llama.cpp's ``p_min`` does,
was measured here: with a 0.3 cut, drafts the serving model kept 96% of came out half as long, and replies
slower.)
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
from ..step.runner import ModelRunner
from ..step.transfer import to_device
from .block_manager import BlockManager
from .draft_trials import CatchUp
from .kv_cache import KVCache, KVShape
from .scheduler import Chunk
from .sequence import Sequence

log = logging.getLogger(__name__)

# a pass's positions of one reply go as decode rows up to this many (the draft catching up after a draft it
# wrote was all kept: two), else as one chunk (a prompt it has not seen)
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
    """One reply in a draft pass: positions ``[start, end)`` computed, and the draft's length wanted."""

    index: int  # the reply's chunk in the step
    seq: Sequence
    start: int
    end: int
    length: int


class DraftModel:
    """The draft model, its KV tensors in the serving model's pool, and the passes that write drafts."""

    def __init__(self, loaded: LoadedModel, pool: KVCache, shape: KVShape, backend: str, vocab_size: int,
                 graph_limits: GraphLimits | None = None) -> None:
        """``loaded`` (see :func:`load_draft_model`) with KV tensors of ``shape`` beside every block of the serving
        model's ``pool``; ``vocab_size``: the serving model's; ``graph_limits``: its passes replay CUDA graphs
        (the pool has the scratch block they need)."""
        self.loaded = loaded
        self.block_size = pool.block_size
        self.kv_cache = KVCache(shape, pool.num_blocks, pool.block_size, loaded.device, pool.reserved_blocks)
        self.runner = ModelRunner(loaded.model, self.kv_cache, loaded.device, backend, graph_limits)
        self.vocab_size = vocab_size  # the serving model's: a draft token past it could not be checked

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
            start = self._computed(chunk.seq, blocks)
            end = min(chunk.start + 1, start + max(budget, 0))
            budget -= end - start
            rows.append(_Row(index, chunk.seq, start, end, len(chunk.draft) if end == chunk.start + 1 else 0))
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
        its last token; each later one over the token the pass before gave."""
        drafts: dict[int, list[int]] = {}
        tokens_in = [row.seq.token_ids[row.start : row.end] for row in rows]
        while rows:
            tokens = self._pass(rows, tokens_in)
            next_rows, next_tokens = [], []
            for row, token in zip(rows, tokens, strict=True):
                row.seq.draft_computed = row.end
                draft = drafts.setdefault(row.index, [])
                if len(draft) >= row.length:
                    continue
                draft.append(token)
                if len(draft) < row.length:
                    next_rows.append(_Row(row.index, row.seq, row.end, row.end + 1, row.length))
                    next_tokens.append([token])
            rows, tokens_in = next_rows, next_tokens
        return drafts

    def _pass(self, rows: list[_Row], tokens_in: list[list[int]]) -> list[int]:
        """The draft model over each row's tokens at positions ``[start, end)``; the greedy next token of each
        row."""
        logits = self._replayed(rows, tokens_in)
        if logits is None:
            logits = self._eager(rows, tokens_in)
        return logits[:, : self.vocab_size].argmax(dim=-1).tolist()

    def _replayed(self, rows: list[_Row], tokens_in: list[list[int]]) -> torch.Tensor | None:
        """The last position's logits of each row from a CUDA graph, every position a decode row; None where the
        pass does not fit one (a prompt to catch up), or no graph can run it."""
        graphs = self.runner.graphs
        if graphs is None or not graphs.fits(sum(map(len, tokens_in))):
            return None
        decode = [position for row, tokens in zip(rows, tokens_in, strict=True)
                  for position in position_rows(tokens, row.start, row.seq.block_table)]
        logits = graphs.run_rows(decode)
        if logits is None:
            return None
        return logits[torch.tensor(list(accumulate(map(len, tokens_in))), device=logits.device) - 1]

    def _eager(self, rows: list[_Row], tokens_in: list[list[int]]) -> torch.Tensor:
        ids: list[int] = []
        slices: list[SequenceSlice] = []
        last: list[int] = []
        for row, tokens in zip(rows, tokens_in, strict=True):
            if self.runner.drafts_as_rows and len(tokens) <= ROWS_UP_TO:  # the native one-call decode step
                slices += [SequenceSlice(len(ids) + j, row.start + j, row.start + j + 1, row.seq.block_table)
                           for j in range(len(tokens))]
            else:
                slices.append(SequenceSlice(len(ids), row.start, row.end, row.seq.block_table))
            ids.extend(tokens)
            last.append(len(ids) - 1)
        meta = build_metadata(self.kv_cache, slices, self.loaded.device, self.runner.backend, self.runner.dtype)
        return self.runner.logits(to_device(torch.tensor(ids), self.loaded.device), meta,
                                  to_device(torch.tensor(last, dtype=torch.long), self.loaded.device))

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
