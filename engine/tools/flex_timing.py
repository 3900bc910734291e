"""What one layer's attention costs on the flex backend, compiled or not, against the torch path, as a step's
shapes change: ``python -m engine.tools.flex_timing [--compiled] [--device cpu|cuda]``.

Each line is one step (decoding sequences, prefill tokens) on SmolLM2-135M's attention shape over a pool of
scattered blocks: the call's time and the graphs dynamo built for it (a first call or a new shape compiles).
The figures in :mod:`engine.step.flex_attention`'s docstring come from this.
"""

from __future__ import annotations

import argparse
import random
import time
import types

import torch

NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEADS, HEAD_DIM = 256, 16, 3, 9, 64
PLAN = [(1, 0), (1, 0), (3, 0), (4, 0), (3, 0), (8, 0), (16, 0), (16, 0), (0, 64), (0, 64), (2, 100), (2, 100),
        (5, 300), (16, 0)]  # (decoding sequences, prefill tokens of one more sequence)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.flex_timing", description=__doc__.splitlines()[0])
    parser.add_argument("--compiled", action="store_true", help="run the flex calls through torch.compile")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args(argv)
    from torch._dynamo.utils import counters

    from ..serving.kv_cache import KVCache, KVShape
    from ..step.attention import build_metadata, paged_attention
    from ..step.flex_attention import build_flex_metadata, flex_paged_attention

    device = torch.device(args.device)
    cache = KVCache(KVShape(1, KV_HEADS, HEAD_DIM, torch.float32), NUM_BLOCKS, BLOCK_SIZE, device)
    cache.keys[0].normal_()
    cache.values[0].normal_()
    rng = random.Random(0)
    layer = types.SimpleNamespace(layer_idx=0)
    for decodes, prefill in PLAN:
        slices, tokens = _step(rng, decodes, prefill)
        q = torch.randn(tokens, HEADS, HEAD_DIM, device=device)
        meta = build_flex_metadata(slices, BLOCK_SIZE, NUM_BLOCKS, device, compiled=args.compiled)
        graphs = counters["stats"]["unique_graphs"]
        flex_ms = _timed(device, flex_paged_attention, q, cache.keys[0], cache.values[0], meta, None)
        graphs = counters["stats"]["unique_graphs"] - graphs
        plain = build_metadata(cache, slices, device, "torch", torch.float32)
        new = torch.randn(1, KV_HEADS, tokens, HEAD_DIM, device=device)
        query = q.transpose(0, 1)[None]
        torch_ms = min(_timed(device, paged_attention, layer, query, new, new, None, kvasir=plain) for _ in range(3))
        print(f"{decodes:2d} decoding, {prefill:3d} prefill tokens: flex {flex_ms:9.1f} ms ({graphs} new graphs), "
              f"torch path {torch_ms:6.2f} ms", flush=True)
    return 0


def _step(rng: random.Random, decodes: int, prefill: int):
    from ..step.attention import SequenceSlice

    free = rng.sample(range(NUM_BLOCKS), NUM_BLOCKS)  # every table scattered over the pool
    slices, offset = [], 0
    for _ in range(decodes):
        length = rng.randint(20, 300)
        slices.append(SequenceSlice(offset, length - 1, length, [free.pop() for _ in range(-(-length // BLOCK_SIZE))]))
        offset += 1
    if prefill:
        length = prefill + 40
        slices.append(SequenceSlice(offset, 40, length, [free.pop() for _ in range(-(-length // BLOCK_SIZE))]))
        offset += prefill
    return slices, offset


@torch.inference_mode()
def _timed(device: torch.device, run, *args, **kwargs) -> float:
    started = time.perf_counter()
    run(*args, **kwargs)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - started)


if __name__ == "__main__":
    raise SystemExit(main())
