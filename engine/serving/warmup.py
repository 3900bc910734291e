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
    seq = Sequence("warm-up", warmup_token_ids(num_tokens, model.config.vocab_size), num_tokens,
                   SamplingParams(max_tokens=1, temperature=0.0), 0.0, block_table=list(range(blocks)))
    runner = ModelRunner(model, cache, device, backend)
    with PeakMemory(device) as peak:
        runner.run([Chunk(seq, 0, num_tokens)])
    del runner, cache
    release_cached_memory(device)
    return peak.bytes


def warmup_token_ids(num_tokens: int, vocab_size: int) -> list[int]:
    """Token ids for the warm-up prompt, all inside the vocabulary: on CUDA an id past it is a device-side assert
    in the embedding, which poisons the whole context (the CPU only raises)."""
    return [i % vocab_size for i in range(num_tokens)]


def release_cached_memory(device: torch.device) -> None:
    """Give the allocator's unused blocks back to the device, so they count as free."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
