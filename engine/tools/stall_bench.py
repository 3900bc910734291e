"""``python -m engine.tools.stall_bench``: does a long prompt stall the replies already streaming?

For 1, 4 and 16 chats streaming greedy replies, a 2,000-token prompt arrives in another chat. Measured: the
running replies' worst and p99 gap between tokens from its arrival until its first token, and its TTFT, against
its TTFT with nothing else running. Each case runs with the engine's step pacing and without it (a latency target
so large that every prompt goes in one step), and on llama-server (when ``make peers`` has built it) with a slot
for every chat and the newcomer, in one run, on the default model. Prints a table; the JSON goes to
``bench/results/stall.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import threading
import time
import urllib.request
from pathlib import Path

from ..config import EngineConfig
from ..models.sources import default_model_path
from ..sampling_params import SamplingParams
from ..serving.async_engine import AsyncEngine
from . import peers

PROMPT_TOKENS = 2000
NO_PACING_S = 1e9  # a target no step reaches: the whole prompt in one step, as before pacing
RESULTS = Path("bench/results/stall.json")
SLOT_CONTEXT = 2304  # llama-server's context per slot: the newcomer's prompt and its token fit


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
    return summary(chats, ttft, gaps)


def summary(chats: int, ttft: float, gaps: list[float]) -> dict:
    """One case's figures: the newcomer's TTFT, and the running replies' worst and p99 gap while it waited."""
    gaps = sorted(gaps) or [0.0]
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
        case.update(engine="kvasir" if paced else "kvasir, one step", ttft_alone_s=round(ttft_alone, 3),
                    ttft_ratio=round(case["newcomer_ttft_s"] / ttft_alone, 2))
        print(json.dumps(case), file=sys.stderr)
        results.append(case)
    return results


# -- llama-server, with a slot for every chat and the newcomer ------------------------------------------------


def _stream_completion(url: str, tokens: list[int], n_predict: int, on_token) -> None:
    """A streamed greedy completion on llama-server; ``on_token(time)`` for every token event, until it ends or
    ``on_token`` returns True."""
    body = {"prompt": tokens, "n_predict": n_predict, "temperature": 0.0, "stream": True, "ignore_eos": True,
            "cache_prompt": False}
    request = urllib.request.Request(url + "/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as reply:
        for line in reply:
            if line.startswith(b"data: ") and on_token(time.perf_counter()):
                return


def llama_newcomer_beside(url: str, chats: int, seed: int, vocab: int) -> dict:
    """The same case as :func:`newcomer_beside`, on llama-server."""
    arrived, gaps, lock = [], [], threading.Lock()
    first_token, all_started = threading.Event(), threading.Event()
    started: set[int] = set()

    def reply(index: int) -> None:
        last, count = [None], [0]

        def on_token(now: float) -> bool:
            count[0] += 1
            with lock:
                if count[0] >= 8:
                    started.add(index)
                    if len(started) == chats:
                        all_started.set()
                if arrived and last[0] is not None and not first_token.is_set():
                    gaps.append(now - last[0])
            last[0] = now
            return first_token.is_set()
        _stream_completion(url, prompt(seed * 1000 + index, vocab, 24), 4000, on_token)

    threads = [threading.Thread(target=reply, args=(i,), daemon=True) for i in range(chats)]
    for thread in threads:
        thread.start()
    if not all_started.wait(300):
        raise RuntimeError("llama-server's replies did not start")
    arrived.append(time.perf_counter())
    _stream_completion(url, prompt(seed * 1000 + 999, vocab, PROMPT_TOKENS), 1, lambda now: first_token.set())
    ttft = time.perf_counter() - arrived[0]
    first_token.set()
    for thread in threads:
        thread.join(300)
    return summary(chats, ttft, gaps)


def llama_alone(url: str, seed: int, vocab: int) -> float:
    started = time.perf_counter()
    _stream_completion(url, prompt(seed, vocab, PROMPT_TOKENS), 1, lambda now: False)
    return time.perf_counter() - started


def llama_cases(chats: list[int], vocab: int) -> list[dict]:
    """Every case on llama-server, one server per number of chats (a slot each, and the newcomer's)."""
    if peers.find_tool("llama-server") is None:
        return [{"engine": "llama-server", "skipped": "llama-server is not built (make peers)"}]
    results = []
    for index, count in enumerate(chats):
        slots = count + 1
        with peers.server(default_model_path(), context=slots * SLOT_CONTEXT,
                          extra_args=("-np", str(slots), "--no-cache-prompt")) as server:
            llama_alone(server.url, 1, vocab)  # warm-up
            ttft_alone = llama_alone(server.url, 2, vocab)
            case = llama_newcomer_beside(server.url, count, 10 + index, vocab)
        case.update(engine="llama-server", ttft_alone_s=round(ttft_alone, 3),
                    ttft_ratio=round(case["newcomer_ttft_s"] / ttft_alone, 2))
        print(json.dumps(case), file=sys.stderr)
        results.append(case)
    return results


def table(results: list[dict]) -> str:
    lines = ["| engine | replies streaming | worst gap | p99 gap | newcomer TTFT | TTFT / alone |",
             "|---|---:|---:|---:|---:|---:|"]
    for case in results:
        if "skipped" in case:
            lines.append(f"| {case['engine']} | {case['skipped']} |")
            continue
        lines.append(f"| {case['engine']} | {case['chats']} | {case['worst_gap_ms']:,.0f} ms | "
                     f"{case['p99_gap_ms']:,.0f} ms | {case['newcomer_ttft_s']:.2f} s | {case['ttft_ratio']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", default="1,4,16", help="how many replies stream beside the newcomer")
    parser.add_argument("--model", default="default")
    args = parser.parse_args(argv)
    chats = [int(c) for c in args.chats.split(",")]
    results, vocab = [], None
    for paced in (True, False):
        engine = AsyncEngine(EngineConfig(model=args.model, step_latency_target_s=None if paced else NO_PACING_S))
        try:
            vocab = engine.tokenizer.vocab_size
            results += asyncio.run(cases(engine, chats, paced))
        finally:
            engine.shutdown()
    if args.model == "default":
        results += llama_cases(chats, vocab)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M:%S"), "cases": results}, indent=2))
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
