"""transformers' own forward pass over the engine's loaded modules: the oracle the checks and the bench compare
against, on the same weights."""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def plain_attention(model):
    """Let transformers' own generation run on the engine's module (same weights) with sdpa attention."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)
