"""``python -m engine.tools.stall_bench``: does a long prompt stall the replies already streaming?

For 1, 4 and 16 chats streaming greedy replies, a 2,000-token prompt arrives in another chat. Measured: the
running replies' worst and p99 gap between tokens from its arrival until its first token, and its TTFT, against
its TTFT with nothing else running. Each case runs with the engine's step pacing and without it (a latency target
so large that every prompt goes in one step), in one run, on the default model. Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

from ..config import EngineConfig
from ..sampling_params import SamplingParams
from ..serving.async_engine import AsyncEngine

PROMPT_TOKENS = 2000
NO_PACING_S = 1e9  # a target no step reaches: the whole prompt in one step, as before pacing


def prompt(seed: int, vocab: int, length: int) -> list[int]:
    """Token ids no other prompt shares (so the prefix cache cannot help)."""
    rng = random.Random(seed)
    return [rng.randrange(100, vocab) for _ in range(length)]


async def newcomer_beside(engine: AsyncEngine, chats: int, seed: int, vocab: int) -> dict:
    """The running replies' gaps and the newcomer's TTFT, with ``chats`` replies streaming."""
    arrived: list[float] = []
    gaps: list[float] = []
    first_token = asyncio.Event()
    all_started = asyncio.Event()
    started = set()

    async def reply(index: int) -> None:
        last = None
        sampling = SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True)  # longer than the case lasts
        async for out in engine.stream(prompt(seed * 1000 + index, vocab, 24), sampling):
            if out.finished and out.finish_reason == "error":
                raise RuntimeError(f"a reply failed: {out.error}")
            now = time.perf_counter()
            if len(out.token_ids) >= 8:
                started.add(index)
                if len(started) == chats:
                    all_started.set()
            if arrived and last is not None and not first_token.is_set():
                gaps.append(now - last)
            last = now
            if first_token.is_set():
                return

    async def newcomer() -> float:
        await all_started.wait()
        arrived.append(time.perf_counter())
        stream = engine.stream(prompt(seed * 1000 + 999, vocab, PROMPT_TOKENS), SamplingParams(max_tokens=1))
        async for _ in stream:
            first_token.set()
        return time.perf_counter() - arrived[0]

    replies = [asyncio.ensure_future(reply(i)) for i in range(chats)]
    ttft = await newcomer()
    await asyncio.gather(*replies)
    gaps.sort()
    return {"chats": chats, "newcomer_ttft_s": round(ttft, 3), "worst_gap_ms": round(1000 * gaps[-1], 1),
            "p99_gap_ms": round(1000 * gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))], 1), "gaps": len(gaps)}


async def alone(engine: AsyncEngine, seed: int, vocab: int) -> float:
    started = time.perf_counter()
    async for _ in engine.stream(prompt(seed, vocab, PROMPT_TOKENS), SamplingParams(max_tokens=1)):
        pass
    return time.perf_counter() - started


async def cases(engine: AsyncEngine, chats: list[int], paced: bool) -> list[dict]:
    """Every case on one engine: the newcomer alone first, then beside each number of chats."""
    vocab = engine.tokenizer.vocab_size
    await alone(engine, 1, vocab)  # warm-up
    ttft_alone = await alone(engine, 2, vocab)
    results = []
    for index, count in enumerate(chats):
        case = await newcomer_beside(engine, count, 10 + index, vocab)
        case.update(paced=paced, ttft_alone_s=round(ttft_alone, 3),
                    ttft_ratio=round(case["newcomer_ttft_s"] / ttft_alone, 2))
        print(json.dumps(case), file=sys.stderr)
        results.append(case)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", default="1,4,16", help="how many replies stream beside the newcomer")
    parser.add_argument("--model", default="default")
    args = parser.parse_args(argv)
    chats = [int(c) for c in args.chats.split(",")]
    results = []
    for paced in (True, False):
        engine = AsyncEngine(EngineConfig(model=args.model, step_latency_target_s=None if paced else NO_PACING_S))
        try:
            results += asyncio.run(cases(engine, chats, paced))
        finally:
            engine.shutdown()
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
