"""A fast look inside a GGUF file: metadata, tensor shapes and whether the file is complete.

The full parse in the ``gguf`` package builds every field, the tokenizer's tens of thousands of strings
included, which takes seconds; this reader skips what it does not need. Every count and length read from the
file is checked against the bytes that remain before it is used, so a damaged or hostile header fails at
once, in words, instead of looping or allocating.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ModelLoadError

MAGIC = b"GGUF"
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
MAX_DIMS = 4  # GGML_MAX_DIMS in ggml.h
MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, the smallest value
MIN_TENSOR_BYTES = 8 + 4 + 4 + 8  # name length, dimension count, type, offset
TOKEN_LIST_KEY = "tokenizer.ggml.tokens"
SMALL_ARRAY_ITEMS = 4096  # numeric arrays up to this long are kept (per-layer values, rope sections); longer ones
# (the vocabulary's scores and types) and arrays of text (tokens, merges) are skipped
# ggml's tensor type numbers (ggml.h) for the types Kvasir treats by name
GGML_TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K",
                   11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 30: "BF16"}


@dataclass(frozen=True, slots=True)
class GGUFInfo:
    path: Path
    metadata: dict
    tensors: dict[str, tuple[tuple[int, ...], int]]  # name -> (shape, ggml type)
    file_size: int
    data_end: int  # where the last tensor's data ends; beyond file_size means the file is truncated
    token_count: int | None = None  # entries in the tokenizer's vocabulary, when the file has one
    data_start: int = 0  # where the tensor data begins (tensor offsets count from here)
    offsets: dict[str, int] = field(default_factory=dict)  # name -> offset of the tensor's data

    def linear_tensors(self) -> dict[str, tuple[tuple[int, ...], int]]:
        """The decoder blocks' matrices (what quantisation replaces): name -> (shape, ggml type)."""
        return {name: entry for name, entry in self.tensors.items() if name.startswith("blk.") and len(entry[0]) == 2}

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_value(self, suffix: str, default=None):
        return self.metadata.get(f"{self.architecture}{suffix}", default)

    def positive_int(self, suffix: str, default: int | None = None) -> int:
        """``<arch><suffix>`` as a positive whole number, or a :class:`ModelLoadError` naming the field."""
        key = f"{self.architecture}{suffix}"
        value = self.metadata.get(key, default)
        if value is None:
            raise ModelLoadError(f"{self.path.name} has no {key} in its metadata")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelLoadError(f"{self.path.name}: {key} is {value!r}; it must be a positive whole number")
        return value

    @property
    def parameter_count(self) -> int:
        count = 0
        for shape, _ in self.tensors.values():
            n = 1
            for d in shape:
                n *= d
            count += n
        return count

    @property
    def truncated(self) -> bool:
        return self.data_end > self.file_size


MAX_ARRAY_DEPTH = 32


class _Reader:
    def __init__(self, buffer) -> None:
        self.buf, self.pos = buffer, 0

    @property
    def remaining(self) -> int:
        return len(self.buf) - self.pos

    def unpack(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        if size > self.remaining:
            raise ModelLoadError("the GGUF header ends early: the file is truncated or is not GGUF")
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def count(self, what: str, min_bytes: int) -> int:
        """A count of items that each take at least ``min_bytes``; more than the file can hold is refused."""
        value = self.unpack("Q")
        if value * min_bytes > self.remaining:
            raise ModelLoadError(
                f"the GGUF header claims {value:,} {what}, more than the {self.remaining:,} bytes left can hold: "
                "the file is damaged or truncated"
            )
        return value

    def string(self) -> str:
        length = self.count("bytes of text", 1)
        raw = self.buf[self.pos : self.pos + length]
        self.pos += length
        return bytes(raw).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        length = self.count("bytes of text", 1)  # read before moving: ``pos += count()`` would use the old pos
        self.pos += length

    def value(self, kind: int, keep: bool, depth: int = 0):
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            if keep:
                return self.string()
            self.skip_string()
            return None
        if kind == _ARRAY:
            return self.skip_array(depth + 1)
        raise ModelLoadError(f"unknown GGUF value type {kind}: the file is damaged")

    def small_array(self) -> list | None:
        """A numeric array of at most :data:`SMALL_ARRAY_ITEMS` items as a list; anything else is skipped (None)."""
        start = self.pos
        item_kind = self.unpack("I")
        if item_kind in _SCALARS:
            size = struct.calcsize("<" + _SCALARS[item_kind])
            count = self.count("array items", size)
            if count <= SMALL_ARRAY_ITEMS:
                values = list(struct.unpack_from(f"<{count}{_SCALARS[item_kind]}", self.buf, self.pos))
                self.pos += count * size
                return values
        self.pos = start
        self.skip_array()
        return None

    def skip_array(self, depth: int = 1) -> int:
        """Skip an array's items; its length is returned (a vocabulary's size, say). Arrays of arrays nest at most
        :data:`MAX_ARRAY_DEPTH` deep (real files hold flat arrays; a deeper one would exhaust the stack)."""
        if depth > MAX_ARRAY_DEPTH:
            raise ModelLoadError(f"the GGUF header nests arrays more than {MAX_ARRAY_DEPTH} deep: the file is "
                                 "damaged or hostile")
        item_kind = self.unpack("I")
        if item_kind in _SCALARS:
            size = struct.calcsize("<" + _SCALARS[item_kind])
            count = self.count("array items", size)
            self.pos += count * size
            return count
        if item_kind not in (_STRING, _ARRAY):
            raise ModelLoadError(f"unknown GGUF value type {item_kind}: the file is damaged")
        count = self.count("array items", 8 if item_kind == _STRING else 12)
        for _ in range(count):
            self.value(item_kind, keep=False, depth=depth)
        return count


_parsed: dict[tuple, GGUFInfo] = {}  # (path, size, mtime) -> info: a load asks several times
PARSED_KEPT = 8


def read_gguf_info(path: str | Path) -> GGUFInfo:
    """Metadata and tensor table of a GGUF file, or a :class:`ModelLoadError` naming the file and the fault.

    Parsed once per file version: the answer is kept while the file's size and modification time stay.
    """
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as exc:
        raise ModelLoadError(f"{path.name} can't be read: {exc.strerror or exc}") from None
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _parsed:
        if len(_parsed) >= PARSED_KEPT:
            _parsed.pop(next(iter(_parsed)))
        _parsed[key] = _read(path)
    return _parsed[key]


def _read(path: Path) -> GGUFInfo:
    try:
        with open(path, "rb") as f:
            if path.stat().st_size < len(MAGIC):
                raise ModelLoadError("it is empty or too short to be a GGUF file")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                return _parse(path, mm)
    except ModelLoadError as exc:
        message = str(exc)
        raise ModelLoadError(message if path.name in message else f"{path.name}: {message}") from None
    except OSError as exc:
        raise ModelLoadError(f"{path.name} can't be read: {exc.strerror or exc}") from None


def _parse(path: Path, mm) -> GGUFInfo:
    if mm[:4] != MAGIC:
        raise ModelLoadError(f"{path.name} is not a GGUF file (it does not start with 'GGUF')")
    r = _Reader(mm)
    r.pos = 4
    version = r.unpack("I")
    if version < 2:
        raise ModelLoadError(f"{path.name} is GGUF version {version}; only version 2 and later are read")
    n_tensors = r.count("tensors", MIN_TENSOR_BYTES)
    n_kv = r.count("metadata entries", MIN_KV_BYTES)
    metadata, token_count = _read_metadata(r, n_kv)
    tensors, ends, offsets = _read_tensor_table(r, n_tensors)
    alignment = metadata.get("general.alignment", 32)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0:
        raise ModelLoadError(f"general.alignment is {alignment!r}; it must be a positive whole number")
    data_start = -(-r.pos // alignment) * alignment
    return GGUFInfo(path, metadata, tensors, len(mm), data_start + ends, token_count, data_start, offsets)


def _read_metadata(r: _Reader, n_kv: int) -> tuple[dict, int | None]:
    metadata, token_count = {}, None
    for _ in range(n_kv):
        key = r.string()
        kind = r.unpack("I")
        if key == TOKEN_LIST_KEY and kind == _ARRAY:
            token_count = r.skip_array()
            continue
        value = r.small_array() if kind == _ARRAY else r.value(kind, keep=True)
        if value is not None:
            metadata[key] = value
    return metadata, token_count


def _read_tensor_table(r: _Reader, n_tensors: int) -> tuple[dict, int, dict]:
    """Names, shapes and types of the tensors, where their data ends, and each one's offset; overlapping data
    is refused."""
    tensors, ranges, offsets = {}, [], {}
    for _ in range(n_tensors):
        name = r.string()
        n_dims = r.unpack("I")
        if n_dims > MAX_DIMS:
            raise ModelLoadError(f"tensor {name!r} has {n_dims} dimensions; GGUF allows at most {MAX_DIMS}")
        dims = tuple(r.unpack("Q") for _ in range(n_dims))
        kind, offset = r.unpack("I"), r.unpack("Q")
        if name in tensors:
            raise ModelLoadError(f"tensor {name!r} is listed twice: the file is damaged")
        tensors[name] = (dims, kind)
        offsets[name] = offset
        ranges.append((offset, offset + _tensor_bytes(name, dims, kind), name))
    _check_no_overlap(ranges)
    return tensors, max((end for _, end, _ in ranges), default=0), offsets


@dataclass(frozen=True, slots=True)
class GGUFTensor:
    """One tensor's data, mapped from the file, in the shapes the ``gguf`` package's reader gives."""

    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF's order, innermost first
    data: np.ndarray  # float types as their values, block types as bytes [rows, bytes a row]


def read_tensors(path: str | Path) -> list[GGUFTensor]:
    """Every tensor of a checked GGUF file (see :func:`read_gguf_info`), its data a read-only memory map."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    info = read_gguf_info(path)
    if info.data_end > info.file_size:
        raise ModelLoadError(f"{Path(path).name} is truncated: its tensors need {info.data_end} bytes")
    mapped = np.memmap(path, dtype=np.uint8, mode="r")
    plain = {GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16,
             GGMLQuantizationType.F64: np.float64, GGMLQuantizationType.I8: np.int8,
             GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
             GGMLQuantizationType.I64: np.int64}
    tensors = []
    for name, (dims, kind) in info.tensors.items():
        ggml_type = GGMLQuantizationType(kind)
        block, type_size = GGML_QUANT_SIZES[ggml_type]
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        start = info.data_start + info.offsets[name]
        raw = mapped[start : start + count * type_size // block]
        shape = tuple(reversed(dims))
        if ggml_type in plain:
            data = raw.view(plain[ggml_type]).reshape(shape)
        else:  # rows of blocks, as bytes
            data = raw.reshape(*shape[:-1], shape[-1] // block * type_size)
        tensors.append(GGUFTensor(name, ggml_type, dims, data))
    return tensors


def _tensor_bytes(name: str, dims: tuple[int, ...], kind: int) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise ModelLoadError(
            f"tensor {name!r} has type id {kind}, which this version of the gguf package does not know: "
            "the file is damaged or needs a newer Kvasir"
        ) from None
    elements = 1
    for d in dims:
        elements *= d
    if dims and dims[0] % block:
        raise ModelLoadError(f"tensor {name!r}: its rows of {dims[0]} do not fill whole blocks of {block}")
    return elements // block * type_size


def _check_no_overlap(ranges: list[tuple[int, int, str]]) -> None:
    ranges.sort()
    for (_, end, first), (start, _, second) in zip(ranges, ranges[1:]):
        if start < end:
            raise ModelLoadError(f"the data of tensors {first!r} and {second!r} overlap: the file is damaged")
