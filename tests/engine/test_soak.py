"""Soak: 64 streams at once with random arrivals and aborts on a small KV pool, for a bounded time.

No request is lost, every one that was not aborted ends at its length with the same tokens as any other greedy
request for the same prompt, no KV block leaks, and resident memory stays flat after warm-up. One request in eight
is long (a prompt of 13 blocks and 40 tokens to write, never aborted); being long, they make up about a third of
the requests running at any time, and four of them fill the pool, so it runs short whatever the machine's speed.
``KVASIR_SOAK_SECONDS`` sets the length (20 s by default, so CI stays short; run minutes by hand).
"""

import asyncio
import os
import random
import statistics
import time

import psutil
import pytest

from engine import AsyncEngine, EngineConfig, SamplingParams
from engine.models.memory import return_freed_memory

CONCURRENCY = 64
SYSTEM_PROMPTS = ["You are a terse assistant. " * 6, "You answer in French. " * 5, ""]
LONG_PROMPT_TOKENS = 200  # 13 blocks of 16; with 40 more tokens, 15 blocks: four of them fill the pool of 48


@pytest.mark.soak
def test_soak_loses_nothing_and_leaks_nothing(tiny_llama):
    duration = float(os.environ.get("KVASIR_SOAK_SECONDS", 20))
    engine = AsyncEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=48, max_model_len=256, max_num_seqs=64))
    try:
        long_prompts = [engine.encode_prompt(long_text(i))[:LONG_PROMPT_TOKENS] for i in range(8)]
        assert all(len(p) == LONG_PROMPT_TOKENS for p in long_prompts)
        tally, rss = asyncio.run(asyncio.wait_for(run_soak(engine, duration, long_prompts), duration + 120))
        stats = wait_for_idle(engine)
    finally:
        engine.shutdown()
    warm, end = settled_memory(rss)
    print(f"soak: {duration:.0f} s, {tally}, preempted {stats.num_preempted_total}, "
          f"resident {warm / 2**20:.0f} -> {end / 2**20:.0f} MiB")
    assert tally["started"] == tally["completed"] + tally["aborted"], tally
    assert tally["completed"] > CONCURRENCY and tally["aborted"] > 0, tally
    assert stats.kv_blocks_used == 0 and stats.num_running == 0 and stats.num_waiting == 0
    assert stats.num_preempted_total > 0, "the pool is meant to be small enough to preempt"
    assert end <= warm * 1.05, f"resident memory grew from {warm / 2**20:.0f} MiB to {end / 2**20:.0f} MiB"


def settled_memory(samples: list[int]) -> tuple[int, int]:
    """Median resident memory just after warm-up (the second quarter of the run) and at its end (the last
    quarter): medians, because the heap's fragmentation moves single samples by a few percent either way,
    while a leak moves the whole distribution."""
    quarter = max(1, len(samples) // 4)
    return statistics.median(samples[quarter : 2 * quarter]), statistics.median(samples[-quarter:])


def held_memory(process) -> int:
    """Resident memory once freed heap pages are handed back: glibc keeps freed pages for reuse, which makes the
    raw figure swing by about 10% with the batch; what is left after trimming is what the process holds."""
    return_freed_memory()
    return process.memory_info().rss


def wait_for_idle(engine, timeout=30.0):
    """The stats once the last aborts have reached the engine thread (they travel through its queue)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = engine.stats()
        if stats.num_running == 0 and stats.num_waiting == 0 and not stats.requests:
            return stats
        time.sleep(0.05)
    return engine.stats()


def long_text(i: int) -> str:
    return " ".join(f"item {i}-{j} in the list of things to remember" for j in range(40))


async def run_soak(engine, duration, long_prompts):
    rng = random.Random(7)
    tally = {"started": 0, "completed": 0, "aborted": 0}
    greedy: dict[str, list[int]] = {}  # prompt -> the longest greedy completion seen
    rss, process = [], psutil.Process()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + duration
    tasks: set[asyncio.Task] = set()
    while loop.time() < deadline:
        while len(tasks) < CONCURRENCY:
            tally["started"] += 1
            tasks.add(asyncio.ensure_future(one_request(engine, rng, tally, greedy, long_prompts)))
        done, tasks = await asyncio.wait(tasks, timeout=0.25, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # an assertion inside a request fails the soak
        rss.append(held_memory(process))
    for task in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(task, BaseException):
            raise task
    return tally, rss


async def one_request(engine, rng, tally, greedy, long_prompts):
    prompt = rng.choice(SYSTEM_PROMPTS) + f"question {rng.randrange(40)}"
    temperature = rng.choice([0.0, 0.0, 0.9])
    params = SamplingParams(max_tokens=rng.randint(1, 40), temperature=temperature, seed=rng.randrange(1000),
                            ignore_eos=True)
    abort_after = rng.choice([None, None, None, 1, 2, 5])
    await asyncio.sleep(rng.random() * 0.05)
    last, count = None, 0
    async for out in engine.stream(prompt, params):
        last, count = out, count + 1
        if abort_after is not None and count >= abort_after and not out.finished:
            tally["aborted"] += 1
            return
    assert last.finished and last.finish_reason == "length" and len(last.token_ids) == params.max_tokens, last
    tally["completed"] += 1
    if temperature == 0.0:
        check_greedy_consistent(greedy, str(prompt), last.token_ids)


def check_greedy_consistent(greedy, prompt, tokens):
    """Greedy replies to one prompt agree token for token, whatever they were batched or preempted with."""
    seen = greedy.get(prompt, [])
    shorter, longer = sorted((seen, tokens), key=len)
    assert longer[: len(shorter)] == shorter, f"greedy replies to {prompt!r} differ"
    greedy[prompt] = longer
