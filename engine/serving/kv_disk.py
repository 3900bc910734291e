"""The prefix cache's disk tier: full KV blocks of recent conversations kept in files, so that a chat continued
after a restart reads its earlier turns back instead of computing them again.

- **What is written**: every full block the block manager hashes (prompt or reply), in the cache's own format
  (keys, values and, for q8_0, scales of every layer), under its chain hash. The step only copies the new
  blocks out of the pool (one ``index_select`` per tensor); a writer thread turns them into files, so no disk
  write is ever on a step's path. A backlog larger than :data:`MAX_PENDING_BYTES` drops blocks rather than
  holding memory or the step.
- **Where**: ``<user cache>/kv-blocks/<namespace>/``, one folder per model file, weight quantisation, KV format,
  block size and cache shape, so blocks of another model or format are never even looked up. The folder is
  capped (``EngineConfig.kv_disk_cache_bytes``); the least recently used ends of chains go first.
- **What is read**: when a prompt's next blocks are not in memory, the blocks that continue its chain on disk
  are loaded into fresh blocks of the pool before its prefill (on the engine's thread) and registered in the
  prefix cache as if computed. Each file says which namespace, hash, parent hash and token ids it holds and
  carries a CRC-32 of its payload; a file that disagrees in any of these, or is truncated, is deleted and
  never served.
- **Closing**: :meth:`DiskTier.close` waits, bounded, for the files still being written; at interpreter exit
  every open tier is closed the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import heapq
import json
import logging
import os
import queue
import struct
import threading
import weakref
import zlib
from collections.abc import Sequence as Seq
from dataclasses import dataclass
from pathlib import Path

import torch

from .block_manager import ROOT_HASH, BlockManager, NewBlock, chain_hash
from .kv_cache import KVCache
from .sequence import Sequence

log = logging.getLogger(__name__)

MAGIC = b"KVSRKV01"
SUFFIX = ".kvb"
MAX_PENDING_BYTES = 256 * 1024**2  # blocks copied out of the pool and not yet written
BYTES_PER_PACED_STEP = 32 * 1024**2  # read from disk in one step while replies are being written (tens of ms)
CLOSE_TIMEOUT_S = 4.0  # within the engine thread's bounded join
EVICT_TO = 0.9  # of the cap, once it is passed


@dataclass(frozen=True, slots=True)
class BlockFile:
    """A block as written: its chain hash, its parent's, its token ids and its bytes (every layer's tensors)."""

    hash: bytes
    parent: bytes
    token_ids: tuple[int, ...]
    payload: bytes


def namespace(model_key: str, cache: KVCache) -> str:
    """The folder name for blocks of this model (file, quantisation, device kind) in this cache's layout."""
    shape = cache.shape
    layout = (f"{model_key}|{cache.format.name}|{cache.block_size}|{shape.num_layers}|{shape.num_kv_heads}|"
              f"{shape.head_dim}")
    return hashlib.sha256(layout.encode()).hexdigest()[:24]


class BlockStore:
    """The files of one namespace: written whole then renamed, checked on every read, capped by size.

    A file is named after its block's hash and its parent's (``<hash>-<parent>.kvb``), so the folder's listing
    alone says which blocks continue which. Over the cap, the least recently used file *that no other file
    continues* goes first: a chain loses its end before its start, and a shared start (a system prompt, found
    in memory and so never read back from disk) is never cut away from the chains behind it.
    """

    def __init__(self, folder: Path, space: str, payload_bytes: int, max_bytes: int) -> None:
        self.folder, self.space, self.payload_bytes, self.max_bytes = folder, space, payload_bytes, max_bytes
        self._lock = threading.Lock()
        self._sizes: dict[bytes, int] = {}  # the files known to be here, by hash
        self._parents: dict[bytes, bytes] = {}
        self._children: dict[bytes, int] = {}  # how many files here continue each block
        self._total = 0
        if folder.is_dir():
            self._scan()

    def _scan(self) -> None:
        """Learn the folder's files from their names; leftovers of an interrupted write are deleted, and a name
        that is not a block's is left alone."""
        for entry in os.scandir(self.folder):
            name = entry.name
            try:
                if name.endswith(".tmp"):
                    os.unlink(entry.path)
                elif name.endswith(SUFFIX):
                    key, parent = _parse_name(name)
                    self._remember(key, parent, entry.stat().st_size)
            except (OSError, ValueError):  # removed meanwhile by another process, or not one of ours
                continue

    def __contains__(self, key: bytes) -> bool:
        return key in self._sizes

    @property
    def total_bytes(self) -> int:
        return self._total

    def path(self, key: bytes, parent: bytes | None = None) -> Path:
        parent = self._parents.get(key, b"") if parent is None else parent
        return self.folder / f"{key.hex()}-{parent.hex() or 'root'}{SUFFIX}"

    def write(self, block: BlockFile) -> None:
        """Store ``block`` (nothing when it is there already), then keep the folder under its cap."""
        if block.hash in self._sizes:
            return
        header = json.dumps({"namespace": self.space, "hash": block.hash.hex(), "parent": block.parent.hex(),
                             "tokens": list(block.token_ids), "payload_bytes": len(block.payload),
                             "crc32": zlib.crc32(block.payload)}).encode()
        data = MAGIC + struct.pack("<I", len(header)) + header + block.payload
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.path(block.hash, block.parent)
        staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        staging.write_bytes(data)
        os.replace(staging, target)
        with self._lock:
            self._remember(block.hash, block.parent, len(data))
        self._evict_over_cap()

    def read(self, key: bytes, parent: bytes, token_ids: tuple[int, ...]) -> bytes | None:
        """The payload of block ``key``, if its file holds exactly that block of this namespace; a file that
        does not is deleted. Marks the file as just used."""
        path = self.path(key)
        try:
            data = path.read_bytes()
        except OSError:
            self._forget(key)
            return None
        problem = self._problem(data, key, parent, token_ids)
        if problem:
            log.warning("ignoring the KV block file %s: %s", path.name, problem)
            self.remove(key)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)
        return data[-self.payload_bytes:]

    def _problem(self, data: bytes, key: bytes, parent: bytes, token_ids: tuple[int, ...]) -> str | None:
        """Why ``data`` is not block ``key`` of this namespace (None when it is)."""
        if len(data) < len(MAGIC) + 4 or not data.startswith(MAGIC):
            return "not a Kvasir KV block file"
        (length,) = struct.unpack_from("<I", data, len(MAGIC))
        start = len(MAGIC) + 4
        try:
            header = json.loads(data[start:start + length])
            payload = data[start + length:]
            facts = (header["namespace"], header["hash"], header["parent"], tuple(header["tokens"]),
                     header["payload_bytes"], header["crc32"])
        except (ValueError, KeyError, TypeError):
            return "its header is damaged"
        if facts[0] != self.space:
            return "it belongs to another model, KV format or block size"
        if (facts[1], facts[2], facts[3]) != (key.hex(), parent.hex(), token_ids):
            return "it holds other tokens than its name says"
        if facts[4] != self.payload_bytes or len(payload) != self.payload_bytes:
            return f"its payload is {len(payload)} bytes, not {self.payload_bytes}"
        if zlib.crc32(payload) != facts[5]:
            return "its payload does not match its checksum"
        return None

    def remove(self, key: bytes) -> None:
        """Delete block ``key``'s file (forgotten even where the system refuses)."""
        with contextlib.suppress(OSError):
            self.path(key).unlink(missing_ok=True)
        self._forget(key)

    def clear(self) -> int:
        """Delete every file of this namespace; returns the bytes freed."""
        with self._lock:
            keys, freed = list(self._sizes), self._total
        for key in keys:
            self.remove(key)
        return freed

    def _remember(self, key: bytes, parent: bytes, size: int) -> None:
        if key not in self._sizes:
            self._parents[key] = parent
            self._children[parent] = self._children.get(parent, 0) + 1
        self._total += size - self._sizes.get(key, 0)
        self._sizes[key] = size

    def _forget(self, key: bytes) -> None:
        with self._lock:
            if key not in self._sizes:
                return
            self._total -= self._sizes.pop(key)
            parent = self._parents.pop(key)
            self._children[parent] -= 1
            if not self._children[parent]:
                del self._children[parent]

    def _evict_over_cap(self) -> None:
        """Least recently used ends of chains first, until the folder is at :data:`EVICT_TO` of its cap."""
        if self._total <= self.max_bytes:
            return
        leaves = [(self._used_at(key), key) for key in list(self._sizes) if not self._children.get(key)]
        heapq.heapify(leaves)
        while leaves and self._total > self.max_bytes * EVICT_TO:
            _, key = heapq.heappop(leaves)
            parent = self._parents.get(key)
            self.remove(key)
            if parent in self._sizes and not self._children.get(parent):
                heapq.heappush(leaves, (self._used_at(parent), parent))  # its last continuation went

    def _used_at(self, key: bytes) -> int:
        try:
            return self.path(key).stat().st_mtime_ns
        except OSError:
            return 0


def _parse_name(name: str) -> tuple[bytes, bytes]:
    """A block file's name as (hash, parent hash); ValueError for a name that is not one."""
    key, parent = name.removesuffix(SUFFIX).split("-")
    return bytes.fromhex(key), b"" if parent == "root" else bytes.fromhex(parent)


_open_tiers: weakref.WeakSet[DiskTier] = weakref.WeakSet()


@atexit.register
def _close_open_tiers() -> None:
    for tier in list(_open_tiers):
        tier.close()


@dataclass(slots=True)
class _Writing:
    """What the writer thread and the engine's thread share: the backlog and the counts (under ``lock``)."""

    lock: threading.Lock
    pending_bytes: int = 0
    written: int = 0
    dropped: int = 0  # not written: the backlog was full, or writing failed
    failure: str | None = None


class DiskTier:
    """The disk tier of one engine's prefix cache: saves newly hashed blocks in the background and extends a
    prompt's cached prefix from disk (see the module's docstring).

    The writer thread holds the store, the queue and the shared counts, never the tier: an engine dropped
    without :meth:`close` still frees its cache, and its writer finishes what it was handed and ends.
    """

    def __init__(self, cache: KVCache, block_manager: BlockManager | None, model_key: str, folder: Path,
                 max_bytes: int) -> None:
        self.cache, self.block_manager = cache, block_manager
        space = namespace(model_key, cache)
        self.store = BlockStore(folder / space, space, _payload_bytes(cache), max_bytes)
        self.hit_tokens_total = 0
        self._writing = _Writing(threading.Lock())
        self._queue: queue.Queue = queue.Queue()
        self._writer = threading.Thread(target=_write_loop, args=(self._queue, self.store, self._writing),
                                        name="kvasir-kv-disk", daemon=True)
        self._writer.start()
        self._closed = False
        weakref.finalize(self, self._queue.put, None)  # dropped unclosed: the writer ends after its backlog
        _open_tiers.add(self)

    @property
    def blocks_written_total(self) -> int:
        return self._writing.written

    @property
    def blocks_dropped_total(self) -> int:
        return self._writing.dropped

    @property
    def failure(self) -> str | None:
        return self._writing.failure

    # -- the engine thread's side -------------------------------------------------------------------

    def save(self, blocks: Seq[NewBlock]) -> None:
        """Copy newly hashed blocks out of the pool and hand them to the writer (never waits for the disk, and
        never fails the step: a failure stops the tier's writing, in words in the stats)."""
        fresh = [b for b in blocks if b.hash not in self.store]
        writing = self._writing
        if not fresh or self._closed or writing.failure is not None:
            return
        size = len(fresh) * self.store.payload_bytes
        with writing.lock:
            if writing.pending_bytes + size > MAX_PENDING_BYTES:
                writing.dropped += len(fresh)
                return
            writing.pending_bytes += size
        try:
            ids = torch.tensor([b.block_id for b in fresh], device=self.cache.keys[0].device)
            copies = [t.view(torch.uint8).index_select(0, ids).cpu() for t in self.cache.tensors()]
            files = [BlockFile(b.hash, b.parent, b.token_ids, _payload(copies, i)) for i, b in enumerate(fresh)]
        except Exception as exc:  # the step's result stands; only the disk copy is given up
            _stop_writing(writing, f"copying KV blocks for the disk failed: {exc}", len(fresh), size)
            return
        self._queue.put(files)

    def extend(self, seq: Sequence, paced: bool = False) -> int:
        """Continue ``seq``'s cached prefix with the blocks that follow it on disk (loaded into fresh blocks and
        registered as cached); returns the tokens loaded. Never covers the prompt's last token, and never fails
        the step: a block that can't be read ends the extension there.

        ``paced`` (replies are being written): at most :data:`BYTES_PER_PACED_STEP` are read; where more would
        follow, ``seq.disk_pending`` says so and the scheduler calls again at the next step."""
        size = self.block_manager.block_size
        parent = seq.block_hashes[-1] if seq.block_hashes else ROOT_HASH
        loaded, allowed = 0, max(1, BYTES_PER_PACED_STEP // self.store.payload_bytes) if paced else None
        seq.disk_pending = False
        while (start := len(seq.block_table) * size) + size <= len(seq.token_ids) - 1:
            tokens = tuple(seq.token_ids[start:start + size])
            key = chain_hash(parent, tokens)
            cached = self.block_manager.take_cached(key, parent, tokens)  # in memory after all (a later block)
            if cached is not None:
                seq.block_table.append(cached)
                seq.block_hashes.append(key)
                parent = key
                continue
            if key not in self.store:
                break
            if allowed is not None and loaded // size >= allowed:
                seq.disk_pending = True  # the next step reads on
                break
            if not self._load_block(seq, key, parent, tokens):
                break
            seq.block_hashes.append(key)
            parent, loaded = key, loaded + size
        seq.num_computed_tokens = len(seq.block_table) * size
        self.hit_tokens_total += loaded
        return loaded

    def _load_block(self, seq: Sequence, key: bytes, parent: bytes, tokens: tuple[int, ...]) -> bool:
        """Block ``key`` from its file into a fresh block at the end of ``seq``'s table, registered as cached."""
        try:
            payload = self.store.read(key, parent, tokens)
        except Exception as exc:  # a folder taken away, a permission changed: computed instead, as if absent
            log.warning("reading a KV block from disk failed: %s", exc)
            return False
        wanted = (len(seq.block_table) + 1) * self.block_manager.block_size
        if payload is None or not self.block_manager.allocate(seq.block_table, wanted):
            return False
        block_id = seq.block_table[-1]
        _load(self.cache, block_id, payload)
        self.block_manager.register(block_id, key, parent, tokens)
        return True

    def clear(self) -> int:
        """Wait for the writes under way, then delete every block file of this model; returns the bytes freed.
        Writing starts again if a failure had stopped it."""
        self.flush()
        freed = self.store.clear()
        with self._writing.lock:
            self._writing.failure = None
        return freed

    def flush(self, timeout: float = CLOSE_TIMEOUT_S) -> bool:
        """Wait (at most ``timeout`` seconds) until every block handed over is written; False on timeout."""
        if self._closed:
            return True
        done = threading.Event()
        self._queue.put(done)  # the writer sets it once everything before it is written
        return done.wait(timeout)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Write what is pending (bounded by ``timeout``) and stop the writer; once."""
        if self._closed:
            return
        self._closed = True
        _open_tiers.discard(self)
        self._queue.put(None)
        self._writer.join(timeout)
        if self._writer.is_alive():
            log.warning("KV blocks still being written after %.0f s; the rest are dropped", timeout)


def _write_loop(work: queue.Queue, store: BlockStore, writing: _Writing) -> None:
    """The writer thread: block files until ``None``; an Event in the queue is set when reached (a flush)."""
    while (batch := work.get()) is not None:
        if isinstance(batch, threading.Event):
            batch.set()
            continue
        for block in batch:
            _write(store, writing, block)


def _write(store: BlockStore, writing: _Writing, block: BlockFile) -> None:
    try:
        if writing.failure is None:
            store.write(block)
            with writing.lock:
                writing.written += 1
                writing.pending_bytes -= len(block.payload)
            return
    except Exception as exc:  # a full disk, a folder taken away: the tier stops writing, the engine goes on
        _stop_writing(writing, f"writing KV blocks to {store.folder} failed: {exc}", 0, 0)
    with writing.lock:
        writing.dropped += 1
        writing.pending_bytes -= len(block.payload)


def _stop_writing(writing: _Writing, failure: str, dropped: int, pending: int) -> None:
    log.warning("%s; the disk tier stops writing", failure)
    with writing.lock:
        writing.failure = failure
        writing.dropped += dropped
        writing.pending_bytes -= pending


def _payload_bytes(cache: KVCache) -> int:
    return sum(t[0].numel() * t.element_size() for t in cache.tensors())


def _payload(copies: list[torch.Tensor], index: int) -> bytes:
    return b"".join(t[index].numpy().tobytes() for t in copies)


def _load(cache: KVCache, block_id: int, payload: bytes) -> None:
    """Put a block's payload into block ``block_id`` of every tensor of the pool."""
    offset = 0
    raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    for tensor in cache.tensors():
        target = tensor[block_id].view(torch.uint8).view(-1)  # as bytes: every type copies so, float8 included
        target.copy_(raw[offset:offset + target.numel()])
        offset += target.numel()
