"""What one step needs beside the weights and the KV cache, measured before the cache is sized.

On a GPU the KV cache takes a share of the memory that is free once the model is in place; but a step also
needs room for its activations, logits and attention workspace, which only running one shows. So the engine
runs its largest step (``max_num_batched_tokens`` prompt tokens) into a throwaway cache just big enough for
it, records the peak above what was allocated before, hands the cached blocks back to the device
(``empty_cache``, so memory the allocator keeps but does not use counts as free) and sizes the cache from what
is left, as vLLM and nano-vllm do.
"""

from __future__ import annotations

import torch

from ..models.memory import PeakMemory
from ..sampling_params import SamplingParams
from ..step.runner import ModelRunner
from .kv_cache import KVCache, KVShape
from .scheduler import Chunk
from .sequence import Sequence


def step_peak_bytes(model: torch.nn.Module, shape: KVShape, block_size: int, device: torch.device, backend: str,
                    num_tokens: int) -> int:
    """Memory a prefill step of ``num_tokens`` tokens takes on ``device`` above what is allocated before it."""
    blocks = -(-num_tokens // block_size)
    cache = KVCache(shape, blocks, block_size, device)
    seq = Sequence("warm-up", list(range(num_tokens)), num_tokens, SamplingParams(max_tokens=1, temperature=0.0),
                   0.0, block_table=list(range(blocks)))
    runner = ModelRunner(model, cache, device, backend)
    with PeakMemory(device) as peak:
        runner.run([Chunk(seq, 0, num_tokens)])
    del runner, cache
    release_cached_memory(device)
    return peak.bytes


def release_cached_memory(device: torch.device) -> None:
    """Give the allocator's unused blocks back to the device, so they count as free."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
