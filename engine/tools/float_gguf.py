"""A GGUF file's weights written again as float32, for llama.cpp's side of the draft-model pair: the model at
full precision (what Kvasir's ``quantization="none"`` holds: the file's weights, dequantised), with the 4-bit file
itself drafting (``llama-server --model-draft``).

``python -m engine.tools.float_gguf IN OUT`` writes one; the benchmark keeps its copy in the peers' cache folder.
"""

from __future__ import annotations

import argparse
from pathlib import Path

FILE_TYPE_KEY = "general.file_type"
ALL_F32 = 0  # llama.cpp's LLAMA_FTYPE_ALL_F32


def write_float32_copy(source: Path, target: Path) -> Path:
    """``source`` with every tensor as float32 and its metadata as it was (the file type said anew)."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(source)
    architecture = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    writer = gguf.GGUFWriter(partial, architecture)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue  # written by the writer itself
        kind = field.types[0]
        value = ALL_F32 if field.name == FILE_TYPE_KEY else field.contents()
        sub_type = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, kind, sub_type=sub_type)
    for tensor in reader.tensors:
        weights = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        writer.add_tensor(tensor.name, np.ascontiguousarray(weights, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.replace(target)
    return target


def float32_copy(source: Path, folder: Path) -> Path:
    """The float32 copy of ``source`` in ``folder``, written the first time it is asked for."""
    stat = source.stat()
    target = folder / f"{source.stem}.{stat.st_size}-{stat.st_mtime_ns}.F32.gguf"
    return target if target.is_file() else write_float32_copy(source, target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    args = parser.parse_args(argv)
    print(write_float32_copy(args.source, args.target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
