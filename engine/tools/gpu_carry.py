"""What the GPU check carries to a machine that has torch and transformers and nothing else.

The lent machine has no network and takes at most 64 MiB of carried files with the working tree, so the carry
holds only what the check imports beyond torch and transformers: the default model's tokenizer; bitsandbytes'
Python files with its CPU library and one CUDA library (``CUDA_LIBRARY``: bitsandbytes picks the highest one of
the runtime's major version not above it, so the lowest 13.x serves every CUDA 13 torch); platformdirs (the
engine's cache folders), psutil (memory; its library is abi3, so any Python 3 loads it) and accelerate (the
loaders build models on ``meta`` with it), each with its ``.dist-info`` (transformers checks versions through it).
Accelerate's own needs (numpy, pyyaml, safetensors, huggingface_hub) are transformers' too.
"""

from __future__ import annotations

import shutil
from pathlib import Path

CUDA_LIBRARY = "libbitsandbytes_cuda130"
CARRY_LIMIT_BYTES = 40 * 2**20  # of the 64 MiB that travel, the rest is the working tree's
PURE_PACKAGES = ("platformdirs", "psutil", "accelerate")


def write_carry(folder: Path) -> int:
    """Write the carry into ``folder``; returns its size in bytes, or raises if it is over the limit."""
    import importlib

    from transformers import AutoTokenizer

    from ..models.sources import default_model_path

    path = default_model_path()
    AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(folder / "tokenizer")
    site = folder / "site"
    _copy_package(importlib.import_module("bitsandbytes"), site, _other_native_libraries)
    for name in PURE_PACKAGES:
        _copy_package(importlib.import_module(name), site, lambda _, names: ["__pycache__", "tests"])
    size = carry_bytes(folder)
    if size > CARRY_LIMIT_BYTES:
        raise RuntimeError(f"the carry is {size / 2**20:.1f} MiB, over its {CARRY_LIMIT_BYTES / 2**20:.0f} MiB limit")
    print(f"{folder}: {size / 2**20:.1f} MiB")
    return size


def carry_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _other_native_libraries(directory: str, names: list[str]) -> list[str]:
    """bitsandbytes' files to leave behind: caches and every native library but the CPU one and ``CUDA_LIBRARY``."""
    keep = ("libbitsandbytes_cpu.", CUDA_LIBRARY + ".")
    return [n for n in names if n == "__pycache__" or (n.startswith("libbitsandbytes_") and not n.startswith(keep))]


def _copy_package(package, site: Path, ignore) -> None:
    name = package.__name__
    shutil.rmtree(site / name, ignore_errors=True)
    shutil.copytree(Path(package.__file__).parent, site / name, ignore=ignore)
    _copy_metadata(name, site)


def _copy_metadata(name: str, site: Path) -> None:
    """The package's ``.dist-info`` folder: transformers checks the versions of what it uses through it."""
    from importlib.metadata import distribution

    dist_info = Path(distribution(name)._path)  # the installed .dist-info folder
    shutil.rmtree(site / dist_info.name, ignore_errors=True)
    shutil.copytree(dist_info, site / dist_info.name)
