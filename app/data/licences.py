"""What the About dialog lists: the bundled model and the main libraries, each with its version and licence as
its installed package metadata declares them (the PyInstaller spec copies the same metadata into the bundle)."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass

from engine import DEFAULT_MODEL_NAME, DEFAULT_MODEL_PACKAGE

# (distribution, what it is in Kvasir). The model first; Qt's row names the Qt version PySide6 wraps.
COMPONENTS = (
    (DEFAULT_MODEL_PACKAGE, f"{DEFAULT_MODEL_NAME}, the bundled model"),
    ("PySide6_Essentials", "Qt and Qt for Python (PySide6), the window"),
    ("shiboken6", "Shiboken, PySide6's bindings"),
    ("torch", "PyTorch, tensors and kernels"),
    ("transformers", "Hugging Face Transformers, model architectures"),
    ("tokenizers", "Hugging Face Tokenizers"),
    ("safetensors", "safetensors, weight files"),
    ("gguf", "gguf, GGUF files"),
    ("bitsandbytes", "bitsandbytes, 4- and 8-bit weights"),
    ("accelerate", "Accelerate, empty-weight models"),
    ("huggingface_hub", "Hugging Face Hub client"),
    ("numpy", "NumPy"),
    ("qasync", "qasync, asyncio on Qt's event loop"),
    ("markdown-it-py", "markdown-it-py, Markdown in replies"),
    ("pygments", "Pygments, code highlighting"),
    ("platformdirs", "platformdirs, user folders"),
    ("psutil", "psutil, memory"),
)
DISTRIBUTIONS = tuple(name for name, _ in COMPONENTS)
LICENCE_CLASSIFIER = "License :: OSI Approved :: "


@dataclass(frozen=True, slots=True)
class Component:
    """One row of the About dialog."""

    name: str
    role: str
    version: str
    licence: str


def licence_of(metadata) -> str:
    """The licence a package declares: its SPDX expression, else its License field's first line, else its
    licence classifiers; "not stated" when it declares none."""
    expression = (metadata.get("License-Expression") or "").strip()
    if expression:
        return expression
    field = (metadata.get("License") or "").strip().splitlines()
    if field and len(field[0]) <= 80 and field[0].upper() != "UNKNOWN":
        return field[0].removesuffix(" License")
    classifiers = [c.removeprefix(LICENCE_CLASSIFIER) for c in metadata.get_all("Classifier") or ()
                   if c.startswith(LICENCE_CLASSIFIER)]
    return ", ".join(classifiers) or "not stated"


def components() -> list[Component]:
    """Every listed component that is installed, with its version and licence."""
    found = []
    for name, role in COMPONENTS:
        try:
            metadata = importlib.metadata.metadata(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        found.append(Component(metadata["Name"], role, metadata["Version"], licence_of(metadata)))
    return found
