"""Counting the calls that would make the host wait for a CUDA device, on the CPU where nothing waits:
``item``, ``tolist``, ``bool`` / ``int`` / ``float`` / ``index`` of a tensor and ``nonzero``."""

from __future__ import annotations

import torch

SYNCING = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero")


def install(monkeypatch) -> dict:
    """Patch ``torch.Tensor`` to count those calls; returns the counter, ``{"n": calls so far}``."""
    counts = {"n": 0}
    for name in SYNCING:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            counts["n"] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts
