"""transformers' own forward pass over the engine's loaded modules: the oracle the checks and the bench compare
against, on the same weights."""

from __future__ import annotations

import contextlib

from ..models.llama_family import transformers_view


@contextlib.contextmanager
def plain_attention(model):
    """transformers' model over the engine's modules (the same weights) with sdpa attention, for its own
    forward pass and generation."""
    view = transformers_view(model)
    previous = view.config._attn_implementation
    view.set_attn_implementation("sdpa")
    try:
        yield view
    finally:
        view.set_attn_implementation(previous)
