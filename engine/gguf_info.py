"""A fast look inside a GGUF file: metadata, tensor shapes and whether the file is complete.

The full parse in the ``gguf`` package builds every field, the tokenizer's tens of thousands of strings
included, which takes seconds; this reader skips what it does not need.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelLoadError

MAGIC = b"GGUF"
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9
WANTED_KEYS = ("general.architecture", "general.name", "general.license", "tokenizer.chat_template")
WANTED_SUFFIXES = (".context_length", ".block_count", ".embedding_length", ".attention.head_count",
                   ".attention.head_count_kv", ".vocab_size")


@dataclass(frozen=True, slots=True)
class GGUFInfo:
    path: Path
    metadata: dict
    tensors: dict[str, tuple[tuple[int, ...], int]]  # name -> (shape, ggml type)
    file_size: int
    data_end: int  # where the last tensor's data ends; beyond file_size means the file is truncated

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_value(self, suffix: str, default=None):
        return self.metadata.get(f"{self.architecture}{suffix}", default)

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


class _Reader:
    def __init__(self, buffer) -> None:
        self.buf, self.pos = buffer, 0

    def unpack(self, fmt: str):
        size = struct.calcsize("<" + fmt)
        if self.pos + size > len(self.buf):
            raise ModelLoadError("the GGUF header ends early: the file is truncated or is not GGUF")
        value = struct.unpack_from("<" + fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def string(self) -> str:
        length = self.unpack("Q")
        raw = self.buf[self.pos : self.pos + length]
        if len(raw) != length:
            raise ModelLoadError("the GGUF header ends early: the file is truncated")
        self.pos += length
        return bytes(raw).decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        length = self.unpack("Q")
        self.pos += length

    def value(self, kind: int, keep: bool):
        if kind in _SCALARS:
            return self.unpack(_SCALARS[kind])
        if kind == _STRING:
            if keep:
                return self.string()
            self.skip_string()
            return None
        if kind == _ARRAY:
            item_kind, count = self.unpack("I"), self.unpack("Q")
            if item_kind in _SCALARS:
                size = count * struct.calcsize("<" + _SCALARS[item_kind])
                self.pos += size
            else:
                for _ in range(count):
                    self.value(item_kind, keep=False)
            return None
        raise ModelLoadError(f"unknown GGUF value type {kind}: the file is damaged")


def read_gguf_info(path: str | Path) -> GGUFInfo:
    """Metadata and tensor table of a GGUF file, or a :class:`ModelLoadError` saying what is wrong."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != MAGIC:
            raise ModelLoadError(f"{path.name} is not a GGUF file (it does not start with 'GGUF')")
        r = _Reader(mm)
        r.pos = 4
        version = r.unpack("I")
        if version < 2:
            raise ModelLoadError(f"{path.name} is GGUF version {version}; only version 2 and later are read")
        n_tensors, n_kv = r.unpack("Q"), r.unpack("Q")
        metadata = {}
        for _ in range(n_kv):
            key = r.string()
            keep = key in WANTED_KEYS or key.endswith(WANTED_SUFFIXES) or key == "general.alignment"
            value = r.value(r.unpack("I"), keep)
            if keep:
                metadata[key] = value
        tensors, ends = {}, 0
        for _ in range(n_tensors):
            name = r.string()
            dims = tuple(r.unpack("Q") for _ in range(r.unpack("I")))
            kind, offset = r.unpack("I"), r.unpack("Q")
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
            elements = 1
            for d in dims:
                elements *= d
            tensors[name] = (dims, kind)
            ends = max(ends, offset + elements // block * type_size)
        alignment = int(metadata.get("general.alignment", 32))
        data_start = -(-r.pos // alignment) * alignment
        return GGUFInfo(path, metadata, tensors, len(mm), data_start + ends)
