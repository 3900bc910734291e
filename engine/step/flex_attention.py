"""Paged attention over PyTorch's FlexAttention, reading the KV pool in place.

Each layer's pool ``[num_blocks, block_size, kv_heads, D]`` is viewed, without a copy, as one long key sequence
``[1, kv_heads, num_blocks * block_size, D]``. A step's attention is at most two FlexAttention calls per layer:

- decode: the sequences with one new token, as a batch ``[B, heads, 1, D]``; row ``b`` of the block mask lists
  sequence ``b``'s physical blocks (so the kernel reads only those), every block but the last as *full*;
- prefill: every prefill chunk's queries packed into one row ``[1, heads, T, D]``, each sequence starting on a
  query-block boundary so that each query block belongs to one sequence and lists that sequence's blocks.

The ``mask_mod`` maps a physical key back to its logical position: ``logical[block]`` is the block's index in the
block table of every sequence that holds it (a shared prefix block has the same index in each, since the prefix
cache keys a block by the hash of everything before it), and the key is the query's own when that sequence's
table has the block at that index; it is visible when its logical position is at most the query's. Query heads
that share a KV head are grouped by the kernel (``enable_gqa``). All of it is built once per step, on the host
as Python lists moved in one copy each, with no wait for the device.

Compilation (FlexAttention is only fast compiled). On CUDA the calls run through ``torch.compile`` (triton
kernels; the flex-decoding kernel for the decode call), with static shapes bucketed so that recompiles stay
bounded: the decode batch padded to a power of two, the prefill row to a power of two of query blocks, the
block-mask width and membership tables as wide as the pool. Measured on the CPU with
``python -m engine.tools.flex_timing [--compiled]`` (2 cores, torch 2.13, one layer of SmolLM2-135M's attention
shape, 9 heads over 3 KV heads of 64, over a 4,096-token pool of scattered blocks):

- compiled (the CPU's C++ template, static shapes): the first call 10 s and each new bucket 4.4-6.6 s with a
  cold inductor cache (4.3 s and 0.25-0.9 s once inductor's on-disk cache holds the kernels), then 11-24 ms a
  call, against 0.2-2.6 ms for the torch path on the same steps; ``dynamic=True`` compiles once but its C++
  fails to build for a batch of one (``cur_qSplitSize8`` undeclared);
- uncompiled: ``flex_attention`` still traces through dynamo (about 0.5 s for each new shape) and materialises
  the scores of every query against every key it is given: 210-1,270 ms a call.

So on the CPU the torch path stays the default, and ``attention_backend="flex"`` runs uncompiled there over the
pool's used prefix (up to the highest block the step reads): a reference path, for checks with small pools.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch

from .transfer import to_device

FLEX_CUDA_BLOCK_SIZE = 128  # KV block size on CUDA: the triton kernels' BLOCK_N must divide it (128 on Hopper and
# Blackwell for head size 64 in bfloat16; 64 or 128 elsewhere)
COMPILED_QUERY_BLOCK = 128  # query block of the compiled kernels: their BLOCK_M (64 or 128) must divide it
EAGER_QUERY_BLOCK = 16  # uncompiled, every padded query costs a row of scores over the whole pool
RECOMPILE_LIMIT = 64


@dataclass(slots=True)
class FlexCall:
    """One FlexAttention call: which of the step's queries it takes, its block mask, where its rows go."""

    block_mask: object  # torch.nn.attention.flex_attention.BlockMask
    decode: bool  # queries as a batch [B, H, 1, D], else one packed row [1, H, T, D]
    query_index: torch.Tensor | None  # rows of the step's queries to gather (None: all of them, in order)
    output_rows: torch.Tensor | None  # rows of the result that are real tokens (None: the first ones, in order)
    tokens: torch.Tensor | None  # where those rows go in the step's output (None: the whole step, in order)
    count: int  # the step's tokens this call computes


@dataclass(slots=True)
class FlexMetadata:
    """What every layer needs for the step's FlexAttention calls."""

    decode: FlexCall | None
    prefill: FlexCall | None
    kv_tokens: int  # keys the calls see: the whole pool compiled, its used prefix uncompiled
    compiled: bool


@dataclass(slots=True)
class _Row:
    """One block-mask row: a decode sequence, or one query block of a prefill chunk."""

    table: list[int]  # the sequence's blocks, up to the one holding its last new token
    first: int  # position of the row's first query
    last: int  # position of the row's last query


def flex_problem(device: torch.device) -> str | None:
    """Why the flex backend can't run on ``device`` with this torch (None when it can): compiled on CUDA, which
    needs triton; uncompiled on the CPU, which still traces through dynamo."""
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no FlexAttention (needs 2.6 or newer)"
    if "compute_q_blocks" not in inspect.signature(BlockMask.from_kv_blocks).parameters:
        return f"torch {torch.__version__}'s FlexAttention builds no inference-only block masks (needs 2.6 or newer)"
    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile does not support this Python version"
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except Exception as exc:
            return f"torch.compile needs triton on CUDA, which does not import ({exc.__class__.__name__}: {exc})"
    return None


def compiles_on(device: torch.device) -> bool:
    """True where the flex backend runs compiled: CUDA (see the module docstring for the CPU's figures)."""
    return device.type == "cuda"


def flex_block_size(block_size: int, device: torch.device) -> int:
    """The KV block size the flex backend runs with on ``device``: on CUDA a multiple of the kernels' tile."""
    if device.type == "cuda" and block_size % FLEX_CUDA_BLOCK_SIZE:
        return FLEX_CUDA_BLOCK_SIZE * -(-block_size // FLEX_CUDA_BLOCK_SIZE)
    return block_size


def flex_compile_failures() -> tuple[type[BaseException], ...]:
    """The exceptions a failed ``torch.compile`` of the flex kernels raises (dynamo's and inductor's, which wraps
    triton's); the runner then redoes the step on the torch path."""
    return (torch._dynamo.exc.TorchDynamoException,)


def compile_failure_reason(exc: BaseException) -> str:
    """The stats' line for a flex backend that could not compile here."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"FlexAttention failed to compile here, so the torch path runs ({exc.__class__.__name__}: {first[:200]})"


# -- per-step metadata -----------------------------------------------------------------------------


def build_flex_metadata(slices, block_size: int, num_blocks: int, device: torch.device,
                        compiled: bool | None = None) -> FlexMetadata:
    """The step's block masks and index tensors; ``slices``: :class:`.attention.SequenceSlice` of each sequence."""
    compiled = compiles_on(device) if compiled is None else compiled
    tables = [s.block_table[: -(-s.end // block_size)] for s in slices]
    width = max(len(t) for t in tables)
    pool_blocks = num_blocks if compiled else max(b for t in tables for b in t) + 1
    padded = [t + [num_blocks] * (width - len(t)) for t in tables]  # num_blocks: a block no table holds
    logical = _logical_positions(to_device(torch.tensor(padded, dtype=torch.int32), device), num_blocks, device)
    shape = _Shape(block_size, pool_blocks, num_blocks, width, compiled, device)
    decode = [i for i, s in enumerate(slices) if s.end - s.start == 1]
    prefill = [i for i, s in enumerate(slices) if s.end - s.start > 1]
    total = sum(s.end - s.start for s in slices)
    return FlexMetadata(
        decode=_decode_call(slices, tables, decode, logical, shape, total) if decode else None,
        prefill=_prefill_call(slices, tables, prefill, logical, shape, total) if prefill else None,
        kv_tokens=pool_blocks * block_size,
        compiled=compiled,
    )


@dataclass(slots=True)
class _Shape:
    block_size: int
    pool_blocks: int  # blocks the calls see as keys
    num_blocks: int  # the pool's block count (also the id of the block no table holds)
    table_width: int  # the longest table of the step: every ``logical`` value is below it
    compiled: bool
    device: torch.device

    @property
    def query_block(self) -> int:
        return COMPILED_QUERY_BLOCK if self.compiled else EAGER_QUERY_BLOCK


def _logical_positions(tables: torch.Tensor, num_blocks: int, device: torch.device) -> torch.Tensor:
    """``[num_blocks + 1]``: each of the step's blocks' index in the tables that hold it (0 for other blocks)."""
    rows, width = tables.shape
    logical = torch.zeros(num_blocks + 1, dtype=torch.int32, device=device)
    index = torch.arange(width, dtype=torch.int32, device=device).repeat(rows)
    return logical.scatter_(0, tables.flatten().long(), index)


def _decode_call(slices, tables, chosen, logical, shape: _Shape, total: int) -> FlexCall:
    rows = [_Row(tables[i], slices[i].start, slices[i].start) for i in chosen]
    count = _bucket(len(rows)) if shape.compiled else len(rows)
    rows += [rows[0]] * (count - len(rows))  # padding repeats a real row: valid work, never read back
    positions = [row.last for row in rows]
    tokens = [slices[i].offset for i in chosen]
    query_index = tokens + [tokens[0]] * (count - len(tokens))
    members, mask_positions = _membership(rows, shape), to_device(torch.tensor(positions, dtype=torch.int32),
                                                                   shape.device)
    block_size = shape.block_size

    def mask_mod(b, h, q_idx, kv_idx):
        block = kv_idx // block_size
        index = logical[block]
        return (members[b, index] == block) & (index * block_size + kv_idx % block_size <= mask_positions[b])

    block_mask = _block_mask(rows, shape, mask_mod, query_length=1, batched=True)
    return FlexCall(block_mask, True, _index_unless_identity(query_index, total, shape.device), None,
                    _index_unless_identity(tokens, total, shape.device), len(tokens))


def _prefill_call(slices, tables, chosen, logical, shape: _Shape, total: int) -> FlexCall:
    block = shape.query_block
    rows: list[_Row] = []
    query_index: list[int] = []
    positions: list[int] = []
    output_rows: list[int] = []
    tokens: list[int] = []
    for i in chosen:
        s = slices[i]
        count = s.end - s.start
        padded = block * -(-count // block)
        output_rows.extend(range(len(query_index), len(query_index) + count))
        tokens.extend(range(s.offset, s.offset + count))
        # padding repeats the chunk's last query, so every row of a query block belongs to its sequence
        query_index.extend(s.offset + min(j, count - 1) for j in range(padded))
        positions.extend(s.start + min(j, count - 1) for j in range(padded))
        rows.extend(_Row(tables[i], s.start + j, s.start + min(j + block, count) - 1) for j in range(0, count, block))
    if shape.compiled:  # a power of two of query blocks: a bounded set of compiled shapes
        extra = _bucket(len(rows)) - len(rows)
        rows += [rows[-1]] * extra
        query_index += query_index[-block:] * extra
        positions += positions[-block:] * extra
    in_order = output_rows == list(range(len(output_rows)))  # one chunk, or chunks that fill their query blocks
    members = _membership(rows, shape)
    mask_positions = to_device(torch.tensor(positions, dtype=torch.int32), shape.device)
    block_size = shape.block_size

    def mask_mod(b, h, q_idx, kv_idx):
        kv_block = kv_idx // block_size
        index = logical[kv_block]
        row = q_idx // block
        return (members[row, index] == kv_block) & (index * block_size + kv_idx % block_size <= mask_positions[q_idx])

    block_mask = _block_mask(rows, shape, mask_mod, query_length=len(query_index), batched=False)
    return FlexCall(block_mask, False, _index_unless_identity(query_index, total, shape.device),
                    None if in_order else _long(output_rows, shape.device),
                    _index_unless_identity(tokens, total, shape.device), len(tokens))


def _membership(rows: list[_Row], shape: _Shape) -> torch.Tensor:
    """``[rows, width]``: each row's block table, padded with the block no table holds to the step's longest
    table; compiled, as wide as the pool (a fixed shape), filled on the device so that the host builds only the
    used part."""
    width = shape.table_width
    tables = to_device(torch.tensor([r.table + [shape.num_blocks] * (width - len(r.table)) for r in rows],
                                    dtype=torch.int32), shape.device)
    if not shape.compiled:
        return tables
    wide = torch.full((len(rows), shape.num_blocks + 1), shape.num_blocks, dtype=torch.int32, device=shape.device)
    wide[:, :width] = tables
    return wide


def _block_mask(rows: list[_Row], shape: _Shape, mask_mod, query_length: int, batched: bool):
    """Row ``r`` visits its sequence's blocks up to its last query's: those wholly at or before its first
    query's position as *full* blocks (no mask evaluated), the rest as partial ones."""
    from torch.nn.attention.flex_attention import BlockMask

    bs = shape.block_size
    full_counts = [(row.first + 1) // bs for row in rows]
    seen_counts = [-(-(row.last + 1) // bs) for row in rows]
    full = [row.table[:n] for row, n in zip(rows, full_counts)]
    partial = [row.table[f:n] for row, f, n in zip(rows, full_counts, seen_counts)]
    view = (len(rows), 1, 1) if batched else (1, 1, len(rows))
    counts = to_device(torch.tensor([full_counts, [n - f for f, n in zip(full_counts, seen_counts)]],
                                    dtype=torch.int32), shape.device)
    return BlockMask.from_kv_blocks(
        counts[1].view(view), _indices(partial, shape).view(*view, -1),
        counts[0].view(view), _indices(full, shape).view(*view, -1),
        BLOCK_SIZE=(shape.query_block, bs), mask_mod=mask_mod,
        seq_lengths=(query_length, shape.pool_blocks * bs), compute_q_blocks=False,
    )


def _indices(lists: list[list[int]], shape: _Shape) -> torch.Tensor:
    """``[rows, width]`` block ids, zero-padded (the kernel reads only each row's count); compiled, as wide as
    the pool (the CPU template requires it, and a fixed width is one compiled shape)."""
    width = max(1, max(len(entry) for entry in lists))
    host = torch.tensor([entry + [0] * (width - len(entry)) for entry in lists], dtype=torch.int32)
    values = to_device(host, shape.device)
    if not shape.compiled:
        return values
    wide = torch.zeros((len(lists), shape.num_blocks), dtype=torch.int32, device=shape.device)
    wide[:, :width] = values
    return wide


def _bucket(count: int) -> int:
    return 1 << (count - 1).bit_length()


def _index_unless_identity(values: list[int], total: int, device: torch.device) -> torch.Tensor | None:
    """An index tensor, or None when ``values`` is every one of the step's ``total`` tokens in order."""
    return None if values == list(range(total)) else _long(values, device)


def _long(values: list[int], device: torch.device) -> torch.Tensor:
    return to_device(torch.tensor(values, dtype=torch.long), device)


# -- the attention function ------------------------------------------------------------------------


def flex_paged_attention(q: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor, meta: FlexMetadata,
                         scaling: float | None) -> torch.Tensor:
    """Attention of the step's queries ``q`` ``[T, H, D]`` over the pool ``[blocks, block_size, KH, D]`` in place;
    returns ``[T, H, D]``."""
    keys, values = _as_one_sequence(cache_k, meta.kv_tokens), _as_one_sequence(cache_v, meta.kv_tokens)
    attend = _compiled_flex_attention() if meta.compiled else _eager_flex_attention()
    queries = q.to(keys.dtype)
    calls = [call for call in (meta.decode, meta.prefill) if call is not None]
    if len(calls) == 1 and calls[0].tokens is None:
        return _run(attend, queries, keys, values, calls[0], scaling).to(q.dtype)
    out = torch.empty_like(queries)
    for call in calls:
        out.index_copy_(0, call.tokens, _run(attend, queries, keys, values, call, scaling))
    return out.to(q.dtype)


def _run(attend, q, keys, values, call: FlexCall, scaling) -> torch.Tensor:
    """One call's rows for its tokens, ``[n, H, D]``."""
    queries = q if call.query_index is None else q.index_select(0, call.query_index)
    queries = queries.unsqueeze(2) if call.decode else queries.transpose(0, 1)[None]
    attended = attend(queries, keys, values, block_mask=call.block_mask, scale=scaling, enable_gqa=True)
    rows = attended[:, :, 0] if call.decode else attended[0].transpose(0, 1)  # [rows, H, D]
    return rows[: call.count] if call.output_rows is None else rows.index_select(0, call.output_rows)


def _as_one_sequence(cache: torch.Tensor, tokens: int) -> torch.Tensor:
    """``[blocks, block_size, KH, D]`` -> ``[1, KH, tokens, D]``, a view of the pool's first ``tokens`` slots."""
    return cache.flatten(0, 1)[:tokens].transpose(0, 1)[None]


def _eager_flex_attention():
    """``flex_attention`` uncompiled; it still traces each new shape through dynamo (an eager backend)."""
    from torch.nn.attention.flex_attention import flex_attention

    _allow_recompiles()
    return _with_static_scale(flex_attention)


@functools.cache
def _compiled_flex_attention():
    """``flex_attention`` compiled once per process, with static shapes (each bucket one more graph)."""
    from torch.nn.attention.flex_attention import flex_attention

    _allow_recompiles()
    return _with_static_scale(torch.compile(flex_attention, dynamic=False, fullgraph=True))


def _with_static_scale(attend):
    """``attend`` with the softmax scale traced as a constant: a scale that changed (another model loaded) would
    otherwise become a graph input read back with ``.item()``, a wait on every call."""

    def attend_with_static_scale(*args, **kwargs):
        with torch._dynamo.config.patch(specialize_float=True):
            return attend(*args, **kwargs)

    return attend_with_static_scale


@functools.cache
def _allow_recompiles() -> None:
    """Raise dynamo's recompile limit (8 graphs per function) to hold every shape a process meets: the
    buckets of decode batches and prefill rows, per model (head sizes are static). Past the limit dynamo stops
    tracing and runs flex_attention's Python reference unrolled, which is slower and waits on values."""
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)
