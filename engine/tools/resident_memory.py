"""What unloading a resident model gives back: the process's resident memory before a second model is loaded
beside the default one, with it loaded and replying, and after it is unloaded, for a few load-unload cycles.

``python -m engine.tools.resident_memory [--model default@none] [--cycles 3]``. The first cycle also counts the
code its model kind imports for the first time (Python modules stay imported); later cycles show what the
model's weights, KV pool and caches leave behind.
"""

from __future__ import annotations

import argparse
import asyncio
import gc

MIB = 2**20


def measure(second: str, cycles: int, progress=print) -> list[dict]:
    from .. import AsyncEngine, EngineConfig, SamplingParams
    from ..models.memory import resident_bytes, return_freed_memory
    from ..serving.resident import config_for

    engine = AsyncEngine(EngineConfig(kv_disk_cache=False))
    params = SamplingParams(max_tokens=32, temperature=0.0)

    async def reply(model=None):
        async for _ in engine.stream("Tell me about Paris.", params, model=model):
            pass

    def settled() -> int:
        gc.collect()
        return_freed_memory()
        return resident_bytes()

    rows = []
    try:
        asyncio.run(reply())
        for cycle in range(cycles):
            before = settled()
            model = asyncio.run(engine.load_model(config_for(second, EngineConfig(kv_disk_cache=False))))
            asyncio.run(reply(model))
            loaded = resident_bytes()
            asyncio.run(engine.unload_model(model))
            after = settled()
            rows.append({"cycle": cycle + 1, "model": model, "before": before, "loaded": loaded, "after": after,
                         "change": (after - before) / before})
            progress(f"cycle {cycle + 1}: before {before / MIB:.1f} MiB, with {model} {loaded / MIB:.1f} MiB, "
                     f"after unloading {after / MIB:.1f} MiB ({100 * rows[-1]['change']:+.1f}% of before)")
    finally:
        engine.shutdown()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="default@none", help="the model loaded and unloaded (MODEL[@QUANT])")
    parser.add_argument("--cycles", type=int, default=3)
    args = parser.parse_args(argv)
    measure(args.model, args.cycles)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
