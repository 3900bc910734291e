"""Decode steps replayed from captured CUDA graphs.

A one-token-per-sequence step of a small model is a few hundred short kernels; launched one by one from Python,
the launches cost more than the arithmetic. A CUDA graph records the kernels of one step once and replays them
with a single launch, as vLLM and nano-vllm do. A graph replays fixed shapes at fixed addresses, so:

- **What is captured.** A pure decode step (every chunk one new token that is sampled, or a draft's check) of
  at most ``max_num_seqs`` rows, on CUDA, through the lean decoder (:mod:`.lean_decoder`). A chunk with a draft
  (speculative decoding) is one row per position, its last token and then each draft token, each attending to
  the positions up to its own (every row's keys and values are written before any row attends), as a decode
  step of those tokens one at a time would. Prefill and mixed steps, larger batches, the CPU, the native CPU
  decoder and transformers' own modules run eagerly as before. Sampling stays outside the graph (its
  parameters change per request).
- **Buckets.** The batch is padded up to the nearest captured size: 1, 2, 4, 8, then steps of 16, and
  ``max_num_seqs`` itself. On the torch attention path the block tables are padded to a width bucket too (powers
  of two up to the model's whole context in blocks), because that path reads every block of the table's width
  (:mod:`.graph_attention`); flash-attn reads each row only up to its length, so it needs one width, the whole
  context. A graph is captured on first use of its (batch size, width) bucket, on the engine thread (one warm-up
  run, a device synchronisation and the recording: milliseconds, a step's worth of latency once per bucket), so
  nothing is captured that is never used and loading does not wait.
- **Inputs.** Each graph owns one small int64 buffer laid out as token ids, positions, cache slots and context
  lengths (``batch`` each), then the block table (``batch x width``). A step writes it with one host-to-device
  copy from pinned memory and replays; the logits land in one static float32 ``[max_num_seqs, vocab]``
  buffer, of which the real rows are returned.
- **Padding rows** write their keys and values to the KV cache's scratch block (``KVCache(reserved_blocks=1)``:
  a block past the ones the block manager hands out, so no sequence ever owns it), read only that block
  (context length 1), and are dropped from the logits; rows are independent through every layer, so they cannot
  disturb the real ones.
- **Memory.** All graphs share one memory pool (graphs never run concurrently, and nothing a graph allocates
  outlives its replay: inputs, outputs and the KV cache live outside the pool), so the pool holds about one
  step's activations at the largest bucket used, plus the driver's copy of each graph. The engine counts the
  pool's growth, the input buffers and the static logits in the memory it reports.
- **Cap.** At most ``MAX_GRAPHS`` graphs are captured: with the torch path's widths, ``max_num_seqs=64`` and a
  4k-token context there are 8 x 9 = 72 buckets, and a step in a bucket past the cap runs eagerly.
  A capture that fails turns graphs off for the engine, with the reason in its stats.

The capture itself is :func:`capture_graph`; everything else runs on the CPU too, where the tests replace the
capture by an eager call of the same function.
"""

from __future__ import annotations

import bisect
import contextlib
import gc
import logging
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from ..serving.kv_cache import KVCache
from ..serving.scheduler import Chunk
from .graph_attention import graph_decode_metadata
from .lean_decoder import LeanDecoder, lean_decoder_for
from .transfer import copy_into

log = logging.getLogger(__name__)

MAX_GRAPHS = 64
SMALL_BATCHES = (1, 2, 4, 8)
BATCH_STEP = 16


@dataclass(frozen=True, slots=True)
class GraphLimits:
    """What fixes the buckets: the largest batch and the longest context a decode step can have."""

    max_num_seqs: int
    max_model_len: int


def graph_batch_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes graphs are captured for: 1, 2, 4, 8, then steps of 16, and ``max_num_seqs``."""
    sizes = [size for size in SMALL_BATCHES if size < max_num_seqs]
    sizes += range(BATCH_STEP, max_num_seqs, BATCH_STEP)
    return sorted(set(sizes)) + [max_num_seqs]


def width_buckets(max_blocks: int) -> list[int]:
    """Block-table widths for the torch path: the powers of two below ``max_blocks``, then ``max_blocks``."""
    widths, width = [], 1
    while width < max_blocks:
        widths.append(width)
        width *= 2
    return widths + [max_blocks]


def bucket(sizes: list[int], needed: int) -> int:
    """The smallest of the (sorted) ``sizes`` that holds ``needed``."""
    return sizes[bisect.bisect_left(sizes, needed)]


def graphs_problem(enabled: bool, device: torch.device, model: torch.nn.Module, backend: str = "torch") -> str | None:
    """Why this engine's decode steps run eagerly, or None when they can replay from CUDA graphs (``backend``:
    the attention backend the engine runs)."""
    if not enabled:
        return "turned off in the settings (cuda_graphs=False)"
    if device.type != "cuda":
        return f"not on the {device.type.upper()}"
    if backend == "flex":  # a graph would replay the torch path's decode attention, not FlexAttention's
        return "FlexAttention's decode steps run eagerly (its compiled kernels are not captured)"
    outliers = _host_reading_layer(model)
    if outliers is not None:
        return outliers
    if lean_decoder_for(model) is None:
        return f"{model.config.model_type} runs through transformers' own modules, which are not captured"
    rope = getattr(model.model.rotary_emb, "rope_type", "default")
    if "dynamic" in rope or rope == "longrope":  # these recompute their frequencies from the positions' maximum
        return f"its {rope} rotary scaling reads the positions on the host"
    return None


def _host_reading_layer(model: torch.nn.Module) -> str | None:
    """Why a layer of ``model`` cannot be captured because it reads the device every call, or None.

    bitsandbytes' int8 layers with an outlier threshold find the activation columns above it with a host read
    (``nonzero`` and a copy back) in every call, which a capture refuses.
    """
    for module in model.modules():
        threshold = getattr(getattr(module, "state", None), "threshold", 0.0)
        if type(module).__name__ == "Linear8bitLt" and threshold > 0:
            return (f"bitsandbytes int8 layers with an outlier threshold ({threshold:g}) read the outlier columns "
                    "back to the host in every call, which a graph cannot capture")
    return None


def device_scope(device: torch.device):
    """``device`` made current while a graph is captured or replayed: a capture records on the current device's
    stream, so on ``cuda:1`` with device 0 current it would record nothing (torch only warns "The CUDA Graph is
    empty") and every replay would do nothing."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def capture_graph(forward, pool, device: torch.device):
    """Record ``forward``'s kernels in a CUDA graph on ``device`` that allocates from ``pool`` (None: a new pool);
    returns the graph and its pool. Called with ``device`` current (:func:`device_scope`); both streams are made
    on it (``torch.cuda.graph``'s own default stream is made once, on whichever device was current then).
    ``forward`` runs once first on a side stream, so that lazy initialisation (cuBLAS workspaces, kernel
    selection) happens before the capture rather than inside it."""
    side, current = torch.cuda.Stream(device=device), torch.cuda.current_stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        forward()
    current.wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # thread_local: only this thread's calls can invalidate the capture, whatever another thread of the app does
    with torch.cuda.graph(graph, pool=pool, stream=torch.cuda.Stream(device=device),
                          capture_error_mode="thread_local"):
        forward()
    return graph, graph.pool()


@dataclass(slots=True)
class _Graph:
    """One bucket: its static input buffer and, once captured, its graph."""

    batch: int
    width: int
    inputs: torch.Tensor  # [batch * 4 + batch * width] int64 on the device
    graph: object | None = None


class DecodeGraphs:
    """Pure decode steps from CUDA graphs, one per (batch size, block-table width) bucket, captured on first use."""

    def __init__(self, decoder: LeanDecoder, kv_cache: KVCache, device: torch.device, flash: bool,
                 limits: GraphLimits, max_graphs: int = MAX_GRAPHS) -> None:
        if kv_cache.scratch_block is None:
            raise ValueError("CUDA-graph decode steps need a KV cache with a reserved scratch block")
        self.decoder, self.kv_cache, self.device, self.flash = decoder, kv_cache, device, flash
        self.batch_sizes = graph_batch_sizes(limits.max_num_seqs)
        max_blocks = -(-limits.max_model_len // kv_cache.block_size)
        self.widths = [max_blocks] if flash else width_buckets(max_blocks)
        self.max_graphs = max_graphs
        self.problem: str | None = None  # set when a capture failed: from then on every step runs eagerly
        self._pool_bytes = 0  # what the captures added to the memory the allocator holds
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._pool = None
        largest = self.batch_sizes[-1]
        self._rows = torch.arange(largest, device=device)
        # float32 whatever the model computes in: the conversion is exact and the sampler works in float32 anyway
        self._logits = torch.empty((largest, decoder.lm_head.out_features), dtype=torch.float32, device=device)
        self._static_bytes = self._logits.nbytes + self._rows.nbytes

    @property
    def num_graphs(self) -> int:
        """Graphs captured so far."""
        return len(self._graphs)

    @property
    def memory_bytes(self) -> int:
        """Device memory the graphs hold: their pool's growth, their input buffers and the static logits."""
        return self._static_bytes + self._pool_bytes + sum(entry.inputs.nbytes for entry in self._graphs.values())

    def takes(self, chunks: list[Chunk]) -> bool:
        """True when ``chunks`` are a decode step a graph can replay: one sampled token each (after a draft, if
        any), few enough rows."""
        return (all(c.samples and c.end - c.start == 1 + len(c.draft) for c in chunks)
                and self.fits(sum(c.end - c.start for c in chunks)))

    def run(self, chunks: list[Chunk]) -> torch.Tensor | None:
        """Logits of every row of ``chunks`` (:func:`decode_rows`), from a replayed graph (a view of a static
        buffer, valid until the next step); None when this step must run eagerly (the graph cap is reached, or
        its capture failed)."""
        return self.run_rows(decode_rows(chunks))

    def fits(self, rows: int) -> bool:
        """Whether a step of ``rows`` decode rows can replay from a graph (before the cap and the context)."""
        return self.problem is None and 0 < rows <= self.batch_sizes[-1]

    def run_rows(self, rows: list[DecodeRow]) -> torch.Tensor | None:
        """The logits of ``rows``, as :meth:`run` gives a step's."""
        block_size = self.kv_cache.block_size
        needed = max(-(-(row.position + 1) // block_size) for row in rows)
        if needed > self.widths[-1]:  # past the context the buckets cover (the engine refuses such requests)
            return None
        batch, width = bucket(self.batch_sizes, len(rows)), bucket(self.widths, needed)
        entry = self._graphs.get((batch, width))
        if entry is None:
            if len(self._graphs) >= self.max_graphs:
                return None
            entry = _Graph(batch, width, torch.zeros(batch * (4 + width), dtype=torch.long, device=self.device))
        with device_scope(self.device):
            copy_into(entry.inputs, self._host_inputs(rows, batch, width))
            if entry.graph is None and not self._capture(entry):
                return None
            entry.graph.replay()
        return self._logits[: len(rows)]

    def forward(self, inputs: torch.Tensor, batch: int, width: int) -> None:
        """The step a graph captures: the lean decoder over ``inputs`` (see :meth:`_host_inputs`), logits into
        the static output. Called without a capture it computes the same step eagerly."""
        ids, positions, slots, lengths = inputs[: 4 * batch].view(4, batch).unbind(0)
        table = inputs[4 * batch :].view(batch, width)
        meta = graph_decode_metadata(self.kv_cache, positions, slots, table, lengths, self.flash)
        self._logits[:batch].copy_(self.decoder(ids, meta, self._rows[:batch]))

    def close(self) -> None:
        """Release every graph and their pool: before the model and the KV cache they point into are freed."""
        if self.device.type == "cuda" and self._graphs:
            torch.cuda.synchronize(self.device)
        self._graphs.clear()
        self._pool = self._logits = self._rows = None
        self._pool_bytes = self._static_bytes = 0
        self.problem = self.problem or "released"  # nothing replays after this

    def _capture(self, entry: _Graph) -> bool:
        # torch.cuda.graph empties the allocator's cache before it records: read what is held after the same
        # emptying, or the freed cache hides the pool's growth
        _empty_cache(self.device)
        before = _reserved_bytes(self.device)
        problem = None
        try:
            entry.graph, self._pool = capture_graph(partial(self.forward, entry.inputs, entry.batch, entry.width),
                                                    self._pool, self.device)
        except Exception as exc:  # an operation that cannot be captured: serve eagerly rather than fail the step
            log.warning("capturing a decode step of %d x %d failed: %r", entry.batch, entry.width, exc)
            problem = f"capturing a decode step failed ({type(exc).__name__}: {exc})"[:300]
        if problem is not None:  # out of the handler: the exception's frames no longer hold the failed graph
            self.close()
            gc.collect()
            _empty_cache(self.device)  # every graph's pool, the failed one's too, goes back to the device
            self.problem = problem
            return False
        self._pool_bytes += max(0, _reserved_bytes(self.device) - before)
        self._graphs[(entry.batch, entry.width)] = entry
        return True

    def _host_inputs(self, rows: list[DecodeRow], batch: int, width: int) -> torch.Tensor:
        """The bucket's inputs on the host: ids, positions, slots, context lengths, then the block table, each
        padded to ``batch`` rows; padding rows and the tables' unused columns point at the scratch block."""
        block_size, scratch = self.kv_cache.block_size, self.kv_cache.scratch_block
        inputs = np.empty(batch * (4 + width), dtype=np.int64)
        columns, table = inputs[: 4 * batch].reshape(4, batch), inputs[4 * batch :].reshape(batch, width)
        columns[:, len(rows) :] = np.array([[0], [0], [scratch * block_size], [1]])  # padding: token 0 at 0
        table.fill(scratch)
        for index, row in enumerate(rows):
            position, blocks = row.position, row.block_table
            columns[:, index] = (row.token, position, blocks[position // block_size] * block_size
                                 + position % block_size, position + 1)
            used = -(-(position + 1) // block_size)
            table[index, :used] = blocks[:used]
        return torch.from_numpy(inputs)


@dataclass(frozen=True, slots=True)
class DecodeRow:
    """One position a graph computes: its token and position, and its sequence's block table (it attends to every
    position up to its own)."""

    token: int
    position: int
    block_table: list[int]


def decode_rows(chunks: list[Chunk]) -> list[DecodeRow]:
    """A decode step's rows, in the order the sampler reads their logits: per chunk its last token, then each of
    its draft tokens."""
    return [row for chunk in chunks for row in position_rows((chunk.seq.token_ids[chunk.start], *chunk.draft),
                                                              chunk.start, chunk.seq.block_table)]


def position_rows(tokens, start: int, block_table: list[int]) -> list[DecodeRow]:
    """``tokens`` at positions ``start``, ``start + 1``, ... of one sequence, a decode row each."""
    return [DecodeRow(token, start + j, block_table) for j, token in enumerate(tokens)]


def _reserved_bytes(device: torch.device) -> int:
    return torch.cuda.memory_reserved(device) if device.type == "cuda" else 0


def _empty_cache(device: torch.device) -> None:
    """Hand the allocator's unused blocks back, after the device's queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
