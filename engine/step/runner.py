"""One forward pass over a packed batch: inputs, attention metadata, logits for sampling rows, sampling."""

from __future__ import annotations

import logging

import torch

from ..serving.kv_cache import KVCache
from ..serving.scheduler import Chunk
from ..serving.speculation import accepted_length
from .attention import SequenceSlice, StepMetadata, build_metadata, uses_native_decode
from .cuda_graphs import DecodeGraphs, GraphLimits
from .flex_attention import compile_failure_reason, flex_compile_failures
from .lean_decoder import LeanDecoder, lean_decoder_for
from .native_decoder import native_decoder_for
from .sampler import Sampler, SamplingRow
from .transfer import to_device

log = logging.getLogger(__name__)


class ModelRunner:
    """Runs the model on the chunks the scheduler picked and samples the next token where one is due."""

    def __init__(self, model: torch.nn.Module, kv_cache: KVCache, device: torch.device, backend: str,
                 graph_limits: GraphLimits | None = None) -> None:
        self.model = model
        self.dtype = next(model.parameters()).dtype
        self.kv_cache = kv_cache
        self.device = device
        self.backend = backend
        self.fallback_reason: str | None = None  # why the flex backend gave way to the torch path, if it did
        self.sampler = Sampler()
        # the fastest forward pass that computes this model: native CPU kernels, the lean decoder, or transformers
        # (FlexAttention replaces the native kernels' attention, so it runs through the lean decoder)
        native = native_decoder_for(model, device, self.dtype) if backend != "flex" else None
        self.lean = native or lean_decoder_for(model)
        # the native decode kernel (every CPU float32 step's decode rows: attention.uses_native_decode) computes a
        # draft's positions fastest as decode rows; torch's attention as one chunk of the sequence, which reads
        # its keys once for all of them (see _pack)
        self.drafts_as_rows = backend == "torch" and uses_native_decode(device, self.dtype)
        # decode steps from CUDA graphs, where the engine asked for them (it reserved the scratch block they need)
        self.graphs: DecodeGraphs | None = None
        if graph_limits is not None and isinstance(self.lean, LeanDecoder):
            self.graphs = DecodeGraphs(self.lean, kv_cache, device, backend == "flash_attn", graph_limits)

    def close(self) -> None:
        """Release the captured graphs (they hold addresses in the model and the KV cache)."""
        if self.graphs is not None:
            self.graphs.close()
            self.graphs = None

    @torch.inference_mode()
    def run(self, chunks: list[Chunk]) -> list[list[int]]:
        """Compute ``chunks``; returns the new tokens of each chunk that reaches its sequence's end: one sampled
        token, or for a chunk with a draft the accepted draft tokens and the one sampled after them (see
        :meth:`_sample`)."""
        logits = self.graphs.run(chunks) if self.graphs is not None and self.graphs.takes(chunks) else None
        if logits is not None:
            return self._sample(logits, chunks)
        input_ids, slices, sample_index = self._pack(chunks, self.drafts_as_rows)
        input_ids = to_device(input_ids, self.device)
        sample_index = to_device(sample_index, self.device)
        try:
            logits = self._forward(input_ids, slices, sample_index)
        except flex_compile_failures() as exc:
            if self.backend != "flex":
                raise
            # the step's cache writes are the same when it runs again, so the torch path can simply redo it
            self.backend, self.fallback_reason = "torch", compile_failure_reason(exc)
            log.warning("%s", self.fallback_reason)
            logits = self._forward(input_ids, slices, sample_index)
        return self._sample(logits, chunks)

    def _sample(self, logits: torch.Tensor, chunks: list[Chunk]) -> list[list[int]]:
        """One row of logits per sampled position: a chunk's last token, and each of its draft tokens.

        Each row is sampled as if the draft before it were the reply so far (its history, and its index in the
        reply, which a seeded request's draws follow), so the token it gives is the one plain decoding would
        give after that prefix. A draft token is kept while it equals its row's token; the first row whose token
        differs (or the row after the whole draft) gives the step's last token. With a draft that is one
        proposal (as n-gram lookup makes), this is the standard accept-or-resample rule: a draft token is kept
        with the probability the model gives it, and a rejected one is replaced by a draw from the model's
        distribution without it, so replies follow the model's distribution exactly, token for token the same
        as without speculation for greedy and seeded requests.
        """
        sampling = [c for c in chunks if c.samples]
        rows = [SamplingRow(c.seq.params, _history(c, j), c.seq.num_output_tokens + j, c.seq.constraint)
                for c in sampling for j in range(len(c.draft) + 1)]
        picked = self.sampler(logits, rows) if rows else []
        tokens, first = [], 0
        for chunk in sampling:
            targets = picked[first : first + len(chunk.draft) + 1]
            first += len(targets)
            chunk.accepted = accepted_length(chunk.draft, targets)
            tokens.append(targets[: chunk.accepted + 1])
        return tokens

    def _forward(self, input_ids, slices, sample_index) -> torch.Tensor:
        meta = build_metadata(self.kv_cache, slices, self.device, self.backend, self.dtype)
        return self.logits(input_ids, meta, sample_index)

    def logits(self, input_ids: torch.Tensor, meta: StepMetadata, sample_index: torch.Tensor) -> torch.Tensor:
        """The model on ``input_ids`` ``[T]`` with ``meta``'s cache and positions; the logits of the rows in
        ``sample_index``. Also for a cache other than the engine's (``eval-quant --kv`` scores through one)."""
        if self.lean:
            return self.lean(input_ids, meta, sample_index)
        return self._transformers_forward(input_ids, meta, sample_index)

    def _transformers_forward(self, input_ids, meta, sample_index) -> torch.Tensor:
        return self.model(
            input_ids=input_ids[None],
            position_ids=meta.positions[None],
            use_cache=False,
            logits_to_keep=sample_index,
            kvasir=meta,
        ).logits[0]

    @staticmethod
    def _pack(chunks: list[Chunk], drafts_as_rows: bool = True):
        """Token ids, attention slices and sampled rows of the step. A chunk with a draft is sampled at every
        position (its last token, then each draft token). With ``drafts_as_rows`` it becomes one decode row per
        position, attending to the positions before it: the same arithmetic as decoding those tokens one step
        at a time, and batched with the other decodes. Else it is one causal chunk, as a prompt's: torch's
        attention then reads the sequence's keys once for all its positions, not once a position (the same
        formulas; on the CPU the sums' order, and so the last bits, may differ from a decode row's, as they do
        between a batched decode row and a lone one)."""
        ids: list[int] = []
        slices: list[SequenceSlice] = []
        sample_index: list[int] = []
        for chunk in chunks:
            if chunk.draft and not drafts_as_rows:
                slices.append(SequenceSlice(len(ids), chunk.start, chunk.end, chunk.seq.block_table))
                sample_index.extend(range(len(ids), len(ids) + chunk.num_tokens))
                ids.extend((chunk.seq.token_ids[chunk.start], *chunk.draft))
                continue
            if chunk.draft:
                for j, token in enumerate((chunk.seq.token_ids[chunk.start], *chunk.draft)):
                    slices.append(SequenceSlice(len(ids), chunk.start + j, chunk.start + j + 1, chunk.seq.block_table))
                    ids.append(token)
                    sample_index.append(len(ids) - 1)
                continue
            slices.append(SequenceSlice(len(ids), chunk.start, chunk.end, chunk.seq.block_table))
            ids.extend(chunk.seq.token_ids[chunk.start : chunk.end])
            if chunk.samples:
                sample_index.append(len(ids) - 1)
        return torch.tensor(ids), slices, torch.tensor(sample_index, dtype=torch.long)


def _history(chunk: Chunk, drafted: int) -> list[int]:
    """The tokens before a chunk's row: the sequence's, then the first ``drafted`` draft tokens. Only the repetition
    penalty reads them, so without one the sequence's own list serves every row, uncopied."""
    if not drafted or chunk.seq.params.repetition_penalty == 1.0:
        return chunk.seq.token_ids
    return chunk.seq.token_ids + list(chunk.draft[:drafted])
