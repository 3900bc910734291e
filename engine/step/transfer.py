"""Moving a step's host-built tensors (token ids, positions, slots, block tables) to the device.

A copy from ordinary (pageable) host memory makes the host wait until the device has it; from pinned memory
the copy is queued and the host goes on building the step. torch's caching host allocator keeps the pinned
buffers, and keeps each one until its copy is done, so pinning every step costs no allocation once warm.
"""

from __future__ import annotations

import torch


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device``: queued from pinned memory on CUDA, as it is on the CPU."""
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def copy_into(target: torch.Tensor, tensor: torch.Tensor) -> None:
    """Copy host ``tensor`` into the device buffer ``target`` (a static graph input), queued as in :func:`to_device`."""
    if target.device.type != "cuda":
        target.copy_(tensor)
        return
    target.copy_(tensor.pin_memory(), non_blocking=True)
