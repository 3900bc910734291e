"""The prefix cache's disk tier: full KV blocks of recent conversations kept in files, so that a chat continued
after a restart reads its earlier turns back instead of computing them again.

- **What is written**: every full block the block manager hashes (prompt or reply), in the cache's own format
  (keys, values and, for q8_0, scales of every layer), under its chain hash. The step only copies the new
  blocks out of the pool (one ``index_select`` per tensor); a writer thread turns them into files, so no disk
  write is ever on a step's path. A backlog larger than :data:`MAX_PENDING_BYTES` drops blocks rather than
  holding memory or the step.
- **Where**: ``<user cache>/kv-blocks/<namespace>/``, one folder per model file, weight quantisation, KV format,
  block size and cache shape, so blocks of another model or format are never even looked up. The folder is
  capped (``EngineConfig.kv_disk_cache_bytes``); the least recently used files go first.
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
import hashlib
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
DEFAULT_MAX_BYTES = 2 * 1024**3
MAX_PENDING_BYTES = 256 * 1024**2  # blocks copied out of the pool and not yet written
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
    """The files of one namespace: written whole then renamed, checked on every read, capped by size (LRU)."""

    def __init__(self, folder: Path, space: str, payload_bytes: int, max_bytes: int) -> None:
        self.folder, self.space, self.payload_bytes, self.max_bytes = folder, space, payload_bytes, max_bytes
        self._lock = threading.Lock()
        self._sizes: dict[bytes, int] = {}  # the files known to be here, by hash
        self._total = 0
        if folder.is_dir():
            for entry in os.scandir(folder):
                if entry.name.endswith(SUFFIX):
                    self._remember(bytes.fromhex(entry.name.removesuffix(SUFFIX)), entry.stat().st_size)

    def __contains__(self, key: bytes) -> bool:
        return key in self._sizes

    @property
    def total_bytes(self) -> int:
        return self._total

    def path(self, key: bytes) -> Path:
        return self.folder / f"{key.hex()}{SUFFIX}"

    def write(self, block: BlockFile) -> None:
        """Store ``block`` (nothing when it is there already), then keep the folder under its cap."""
        if block.hash in self._sizes:
            return
        header = json.dumps({"namespace": self.space, "hash": block.hash.hex(), "parent": block.parent.hex(),
                             "tokens": list(block.token_ids), "payload_bytes": len(block.payload),
                             "crc32": zlib.crc32(block.payload)}).encode()
        data = MAGIC + struct.pack("<I", len(header)) + header + block.payload
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.path(block.hash)
        staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        staging.write_bytes(data)
        os.replace(staging, target)
        with self._lock:
            self._remember(block.hash, len(data))
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
        try:
            os.utime(path)
        except OSError:
            pass
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
        self.path(key).unlink(missing_ok=True)
        self._forget(key)

    def clear(self) -> int:
        """Delete every file of this namespace; returns the bytes freed."""
        with self._lock:
            keys, freed = list(self._sizes), self._total
        for key in keys:
            self.remove(key)
        return freed

    def _remember(self, key: bytes, size: int) -> None:
        self._total += size - self._sizes.get(key, 0)
        self._sizes[key] = size

    def _forget(self, key: bytes) -> None:
        with self._lock:
            self._total -= self._sizes.pop(key, 0)

    def _evict_over_cap(self) -> None:
        if self._total <= self.max_bytes:
            return
        files = []
        for key in list(self._sizes):
            try:
                files.append((self.path(key).stat().st_mtime_ns, key))
            except OSError:
                self._forget(key)
        for _, key in sorted(files):
            if self._total <= self.max_bytes * EVICT_TO:
                break
            self.remove(key)


_open_tiers: weakref.WeakSet[DiskTier] = weakref.WeakSet()


@atexit.register
def _close_open_tiers() -> None:
    for tier in list(_open_tiers):
        tier.close()


class DiskTier:
    """The disk tier of one engine's prefix cache: saves newly hashed blocks in the background and extends a
    prompt's cached prefix from disk (see the module's docstring)."""

    def __init__(self, cache: KVCache, block_manager: BlockManager, model_key: str, folder: Path,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.cache, self.block_manager = cache, block_manager
        space = namespace(model_key, cache)
        self.store = BlockStore(folder / space, space, _payload_bytes(cache), max_bytes)
        self.hit_tokens_total = 0
        self.blocks_written_total = 0
        self.blocks_dropped_total = 0  # not written: the backlog was full, or writing failed
        self.failure: str | None = None
        self._pending_bytes = 0
        self._pending_lock = threading.Lock()
        self._queue: queue.Queue[list[BlockFile] | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="kvasir-kv-disk", daemon=True)
        self._writer.start()
        _open_tiers.add(self)

    # -- the engine thread's side -------------------------------------------------------------------

    def save(self, blocks: Seq[NewBlock]) -> None:
        """Copy newly hashed blocks out of the pool and hand them to the writer (never waits for the disk)."""
        fresh = [b for b in blocks if b.hash not in self.store]
        if not fresh or self.failure is not None:
            return
        size = len(fresh) * self.store.payload_bytes
        with self._pending_lock:
            if self._pending_bytes + size > MAX_PENDING_BYTES:
                self.blocks_dropped_total += len(fresh)
                return
            self._pending_bytes += size
        ids = torch.tensor([b.block_id for b in fresh], device=self.cache.keys[0].device)
        copies = [t.view(torch.uint8).index_select(0, ids).cpu() for t in _block_tensors(self.cache)]
        self._queue.put([BlockFile(b.hash, b.parent, b.token_ids, _payload(copies, i)) for i, b in enumerate(fresh)])

    def extend(self, seq: Sequence) -> int:
        """Continue ``seq``'s cached prefix with the blocks that follow it on disk (loaded into fresh blocks and
        registered as cached); returns the tokens loaded. Never covers the prompt's last token."""
        size = self.block_manager.block_size
        parent = seq.block_hashes[-1] if seq.block_hashes else ROOT_HASH
        loaded = 0
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
            payload = self.store.read(key, parent, tokens)
            if payload is None or not self.block_manager.allocate(seq.block_table, start + size):
                break
            block_id = seq.block_table[-1]
            _load(self.cache, block_id, payload)
            self.block_manager.register(block_id, key, parent, tokens)
            seq.block_hashes.append(key)
            parent, loaded = key, loaded + size
        seq.num_computed_tokens = len(seq.block_table) * size
        self.hit_tokens_total += loaded
        return loaded

    def clear(self) -> int:
        """Wait for the writes under way, then delete every block file of this model; returns the bytes freed."""
        self.flush()
        return self.store.clear()

    def flush(self, timeout: float = CLOSE_TIMEOUT_S) -> bool:
        """Wait (at most ``timeout`` seconds) until every block handed over is written; False on timeout."""
        done = threading.Event()
        self._queue.put(done)  # type: ignore[arg-type]  # the writer sets it once everything before it is written
        return done.wait(timeout)

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> None:
        """Write what is pending (bounded by ``timeout``) and stop the writer."""
        if not self._writer.is_alive():
            return
        self._queue.put(None)
        self._writer.join(timeout)
        if self._writer.is_alive():
            log.warning("KV blocks still being written after %.0f s; the rest are dropped", timeout)
        _open_tiers.discard(self)

    # -- the writer thread --------------------------------------------------------------------------

    def _write_loop(self) -> None:
        while (batch := self._queue.get()) is not None:
            if isinstance(batch, threading.Event):
                batch.set()
                continue
            for block in batch:
                self._write(block)

    def _write(self, block: BlockFile) -> None:
        try:
            if self.failure is None:
                self.store.write(block)
                self.blocks_written_total += 1
            else:
                self.blocks_dropped_total += 1
        except Exception as exc:  # a full disk, a folder taken away: the tier stops writing, the engine goes on
            self.failure = f"writing KV blocks to {self.store.folder} failed: {exc}"
            log.warning("%s; the disk tier stops writing", self.failure)
            self.blocks_dropped_total += 1
        finally:
            with self._pending_lock:
                self._pending_bytes -= len(block.payload)


def _block_tensors(cache: KVCache) -> list[torch.Tensor]:
    """Every tensor of the pool, in the order a block's payload holds them: per layer keys, values, scales."""
    tensors = []
    for layer in range(cache.shape.num_layers):
        tensors += [cache.keys[layer], cache.values[layer]]
        if cache.key_scales:
            tensors += [cache.key_scales[layer], cache.value_scales[layer]]
    return tensors


def _payload_bytes(cache: KVCache) -> int:
    return sum(t[0].numel() * t.element_size() for t in _block_tensors(cache))


def _payload(copies: list[torch.Tensor], index: int) -> bytes:
    return b"".join(t[index].numpy().tobytes() for t in copies)


def _load(cache: KVCache, block_id: int, payload: bytes) -> None:
    """Put a block's payload into block ``block_id`` of every tensor of the pool."""
    offset = 0
    raw = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    for tensor in _block_tensors(cache):
        target = tensor[block_id].view(torch.uint8).view(-1)  # as bytes: every type copies so, float8 included
        target.copy_(raw[offset:offset + target.numel()])
        offset += target.numel()
