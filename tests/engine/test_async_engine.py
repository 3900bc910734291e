"""The engine in its own thread: streaming into asyncio, abort on break and on cancel, stats from anywhere."""

import asyncio
import threading

import pytest

from engine import AsyncEngine, EngineConfig, SamplingParams


@pytest.fixture(scope="module")
def async_engine(tiny_llama):
    engine = AsyncEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=128))
    yield engine
    engine.shutdown()


async def wait_until(predicate, timeout=10.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


def test_stream_yields_deltas_until_finished(async_engine):
    async def main():
        pieces, last = [], None
        async for out in async_engine.stream("hello", SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)):
            pieces.append(out.delta_text)
            last = out
        return pieces, last

    pieces, last = asyncio.run(main())
    assert last.finished and last.finish_reason == "length" and len(last.token_ids) == 12
    assert "".join(pieces) == last.text


def test_two_streams_run_concurrently(async_engine):
    events = []

    async def consume(name):
        async for out in async_engine.stream(name, SamplingParams(max_tokens=30, ignore_eos=True)):
            events.append((name, len(out.token_ids)))

    async def main():
        await asyncio.gather(consume("first"), consume("second"))

    asyncio.run(main())
    assert events.count(("first", 30)) == 1 and events.count(("second", 30)) == 1
    # Interleaved: the second stream's first token came before the first stream's last.
    assert events.index(("second", 1)) < events.index(("first", 30))


def test_breaking_out_aborts_and_frees_blocks(async_engine):
    async def main():
        async for out in async_engine.stream("go on", SamplingParams(max_tokens=500, ignore_eos=True)):
            if len(out.token_ids) >= 3:
                break
        await wait_until(lambda: async_engine.stats().kv_blocks_used == 0 and async_engine.stats().num_running == 0)

    asyncio.run(main())


def test_cancelling_the_task_aborts(async_engine):
    async def consume():
        async for _ in async_engine.stream("and on", SamplingParams(max_tokens=500, ignore_eos=True)):
            pass

    async def main():
        task = asyncio.create_task(consume())
        await wait_until(lambda: async_engine.stats().num_running == 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_until(lambda: async_engine.stats().kv_blocks_used == 0 and async_engine.stats().num_running == 0)

    asyncio.run(main())


def test_stats_can_be_read_from_another_thread(async_engine):
    seen = []
    thread = threading.Thread(target=lambda: seen.append(async_engine.stats()))
    thread.start()
    thread.join()
    assert seen[0].kv_blocks_total == 128


def test_bad_prompt_raises_in_the_stream(async_engine):
    async def main():
        async for _ in async_engine.stream(12345):
            pass

    with pytest.raises(ValueError, match="a prompt is a string"):
        asyncio.run(main())


def test_failed_load_raises_in_the_constructor():
    from engine import ModelLoadError

    with pytest.raises(ModelLoadError):
        AsyncEngine(EngineConfig(model="/nowhere/at/all"))


def test_an_abandoned_stream_stops_generating(async_engine):
    """A stream dropped without being read to the end is aborted, not run to max_tokens."""
    import gc

    async def main():
        stream = async_engine.stream("left behind", SamplingParams(max_tokens=1000, ignore_eos=True))
        await stream.__anext__()
        del stream
        gc.collect()
        await wait_until(lambda: async_engine.stats().num_running == 0 and async_engine.stats().kv_blocks_used == 0)
        return async_engine.stats().generated_tokens_total

    before = async_engine.stats().generated_tokens_total
    after = asyncio.run(main())
    assert after - before < 1000


def test_a_dead_engine_thread_ends_every_stream_at_once(tiny_llama):
    """If the thread dies despite everything, open streams end with the reason, and later calls raise."""
    from engine import EngineDeadError

    reasons = []
    engine = AsyncEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=64), on_failure=reasons.append)

    def sabotage(e):
        def boom(*args):
            raise RuntimeError("corrupted state")

        e.step = boom
        e.fail_all = boom

    async def main():
        streams = [engine.stream(p, SamplingParams(max_tokens=500, ignore_eos=True)) for p in ("one", "two")]
        await streams[0].__anext__()
        await engine.run(sabotage)
        for stream in streams:
            with pytest.raises(EngineDeadError, match="corrupted state"):
                async for _ in stream:
                    pass
        with pytest.raises(EngineDeadError):
            engine.stream("after", SamplingParams(max_tokens=4))

    asyncio.run(asyncio.wait_for(main(), 30))
    assert len(reasons) == 1 and "corrupted state" in reasons[0]
    assert not engine.alive and engine.failure == reasons[0]
    with pytest.raises(EngineDeadError):
        engine.call(lambda e: None).result(timeout=5)
    engine.shutdown()


def test_after_shutdown_streams_are_refused_in_words(tiny_llama):
    from engine import EngineDeadError

    engine = AsyncEngine(EngineConfig(model=str(tiny_llama), num_kv_blocks=64))
    engine.shutdown()

    async def main():
        engine.stream("hello")

    with pytest.raises(EngineDeadError, match="shut down"):
        asyncio.run(main())


def test_a_caller_handed_its_final_output_sees_stats_that_count_it(async_engine):
    """The snapshot is taken before outputs are delivered, so a client that reads the stats (GET /metrics) as its
    reply ends never sees numbers from before it."""
    async def main():
        for _ in range(6):
            before = async_engine.stats().generated_tokens_total
            async for out in async_engine.stream("Count with me", SamplingParams(max_tokens=5, ignore_eos=True)):  # noqa: B007
                pass
            assert out.finished and async_engine.stats().generated_tokens_total == before + 5
    asyncio.run(main())
