"""Several models resident in one engine thread: each request on its model, replies on two models written at the
same time, a load that never stops another model's replies, unloading, and the endpoint routing by ``model``."""

from __future__ import annotations

import asyncio
import gc
import threading
import types
import weakref
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from engine import ApiConfig, ApiServer, AsyncEngine, Engine, EngineConfig, ModelLibrary, SamplingParams
from engine.api.model_loader import OnDemandModels
from engine.errors import EngineDeadError
from engine.routing.router import Routes, Rule
from engine.serving.async_engine import UnknownModel
from engine.serving.resident import config_for, split_model_spec

pytestmark = pytest.mark.timeout(120)  # nothing here may hang the run
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def tiny_config(model) -> EngineConfig:
    return EngineConfig(model=str(model), num_kv_blocks=64, max_model_len=256, kv_disk_cache=False)


async def collect(stream) -> list:
    return [out async for out in stream]


async def wait_until(predicate, timeout=60.0):
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def oracles(tiny_model_dirs):
    """Each tiny model alone in a plain Engine: what it says to a prompt, greedy."""
    return {arch: Engine(tiny_config(tiny_model_dirs[arch])) for arch in ("llama", "qwen2")}


@pytest.fixture(scope="module")
def two_models(tiny_model_dirs):
    engine = AsyncEngine(tiny_config(tiny_model_dirs["llama"]))
    asyncio.run(engine.load_model(tiny_config(tiny_model_dirs["qwen2"])))
    yield engine
    engine.shutdown()


def test_model_specs():
    assert split_model_spec("default@none") == ("default", "none")
    assert split_model_spec("default") == ("default", "auto")
    assert split_model_spec("models/a@b.gguf") == ("models/a@b.gguf", "auto")  # part of a file name
    with pytest.raises(ValueError, match="'int3' is not a quantisation; one of auto, none, int4"):
        split_model_spec("default@int3")
    config = config_for("default@w8", EngineConfig(max_num_seqs=3))
    assert (config.model, config.quantization, config.max_num_seqs) == ("default", "w8", 3)


def test_both_models_are_resident_by_id(two_models):
    assert two_models.model_ids() == ["llama", "qwen2"]
    assert two_models.model_id() == "llama"  # the first loaded is the primary
    assert two_models.stats("qwen2").model_name == "qwen2" and two_models.stats().model_name == "llama"
    with pytest.raises(UnknownModel, match="'nope' is not loaded; loaded: llama, qwen2"):
        two_models.model_id("nope")


def test_each_request_runs_on_its_model(two_models, oracles):
    async def main():
        return await asyncio.gather(*(collect(two_models.stream("The sky is", GREEDY, model=arch))
                                      for arch in ("llama", "qwen2")))

    llama, qwen2 = asyncio.run(main())
    for arch, outputs in (("llama", llama), ("qwen2", qwen2)):
        expected = oracles[arch].generate(["The sky is"], GREEDY)[0].token_ids
        assert outputs[-1].token_ids == expected, arch
    assert llama[-1].token_ids != qwen2[-1].token_ids  # two different models, so the check above means something


def test_replies_on_two_models_are_written_at_the_same_time(two_models):
    events = []

    async def consume(arch):
        async for out in two_models.stream("Once upon a time", SamplingParams(max_tokens=30, ignore_eos=True),
                                           model=arch):
            events.append((arch, len(out.token_ids)))

    async def main():
        await asyncio.gather(consume("llama"), consume("qwen2"))

    asyncio.run(main())
    assert events.index(("qwen2", 1)) < events.index(("llama", 30))
    assert events.index(("llama", 1)) < events.index(("qwen2", 30))


def test_loading_a_model_never_stops_the_replies_of_another(tiny_model_dirs):
    """The load waits, inside its own progress report, for the running reply to advance by five tokens: were the
    load to hold the engine thread, that would never happen and the load would not finish."""
    engine = AsyncEngine(tiny_config(tiny_model_dirs["llama"]))
    tokens = [0]
    advanced = threading.Event()
    waited = []

    def progress(fraction, phrase):
        if not waited:
            start = tokens[0]
            waited.append(start)
            for _ in range(600):
                if tokens[0] >= start + 5:
                    advanced.set()
                    return
                threading.Event().wait(0.1)

    async def main():
        async def reply():
            async for out in engine.stream("go on", SamplingParams(max_tokens=200, ignore_eos=True)):
                tokens[0] = len(out.token_ids)
                if advanced.is_set():
                    break

        writer = asyncio.ensure_future(reply())
        await wait_until(lambda: tokens[0] > 0)
        new_id = await engine.load_model(tiny_config(tiny_model_dirs["qwen2"]), progress)
        await writer
        return new_id

    try:
        assert asyncio.run(main()) == "qwen2"
        assert waited and advanced.is_set()
    finally:
        engine.shutdown()


def test_the_same_model_twice_is_refused(two_models, tiny_model_dirs):
    with pytest.raises(ValueError, match="already resident as 'qwen2'"):
        asyncio.run(two_models.load_model(tiny_config(tiny_model_dirs["qwen2"])))
    assert two_models.model_ids() == ["llama", "qwen2"]


def test_unloading_ends_its_replies_and_lets_its_model_go(tiny_model_dirs):
    engine = AsyncEngine(tiny_config(tiny_model_dirs["llama"]))
    try:
        asyncio.run(engine.load_model(tiny_config(tiny_model_dirs["qwen2"])))
        model = engine.call(lambda e: weakref.ref(e.loaded.model), "qwen2").result()
        outputs = []

        async def main():
            stream = engine.stream("go on", SamplingParams(max_tokens=200, ignore_eos=True), model="qwen2")
            outputs.append(await anext(stream))
            assert not outputs[0].finished
            await engine.unload_model("qwen2")
            return await collect(stream)

        rest = asyncio.run(main())
        assert rest[-1].finished and rest[-1].finish_reason == "abort" and "unloaded" in rest[-1].error
        assert engine.model_ids() == ["llama"]
        gc.collect()
        assert model() is None  # nothing holds the weights any more
        with pytest.raises(UnknownModel):
            engine.model_id("qwen2")
        with pytest.raises(ValueError, match="the only model loaded"):
            asyncio.run(engine.unload_model("llama"))
    finally:
        engine.shutdown()


def test_a_model_unused_for_the_idle_time_is_unloaded(tiny_model_dirs):
    engine = AsyncEngine(tiny_config(tiny_model_dirs["llama"]))
    try:
        asyncio.run(engine.load_model(tiny_config(tiny_model_dirs["qwen2"])))
        engine.idle_unload_s = 0.0

        async def main():
            await wait_until(lambda: engine.model_ids() == ["llama"])

        asyncio.run(main())  # the primary stays however long it is idle
    finally:
        engine.shutdown()


def test_a_request_for_an_unloaded_model_ends_with_a_reason(tiny_model_dirs):
    engine = AsyncEngine(tiny_config(tiny_model_dirs["llama"]))
    try:
        asyncio.run(engine.load_model(tiny_config(tiny_model_dirs["qwen2"])))

        async def main():
            engine.call(lambda e: e, "qwen2").result()  # resolved now...
            stream = engine.stream([1, 2, 3], GREEDY, model="qwen2")
            await engine.unload_model("qwen2")  # ...and gone before or while it runs
            return await collect(stream)

        try:
            outputs = asyncio.run(main())
        except EngineDeadError as exc:
            assert "unloaded" in str(exc)
        else:
            assert outputs[-1].finish_reason == "abort" and "unloaded" in outputs[-1].error
    finally:
        engine.shutdown()


# -- the endpoint ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(two_models):
    server = ApiServer(lambda: two_models, ApiConfig(port=0),
                       routes=Routes([Rule("qwen2", keywords=("code",))], fallback="llama"))
    server.start()
    yield openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=30)
    server.stop()


def test_models_lists_every_resident_model_and_auto(client):
    assert [m.id for m in client.models.list().data] == ["llama", "qwen2", "auto"]
    assert client.models.retrieve("qwen2").id == "qwen2"


def test_requests_go_to_the_model_they_name(client, oracles):
    for arch in ("llama", "qwen2"):
        reply = client.completions.create(model=arch, prompt="The sky is", max_tokens=24, temperature=0)
        assert reply.model == arch
        assert reply.choices[0].text == oracles[arch].generate(["The sky is"], GREEDY)[0].text


def test_an_unknown_model_is_a_404_listing_the_loaded_ones(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="nope", prompt="hi", max_tokens=2)
    assert "'nope' does not exist; this server serves 'llama', 'qwen2'" in str(caught.value)


def test_auto_follows_the_rules_and_says_where_it_went(client):
    messages = [{"role": "user", "content": "Write some code for me"}]
    raw = client.chat.completions.with_raw_response.create(model="auto", messages=messages, max_tokens=4)
    assert raw.headers["x-kvasir-routed-to"] == "qwen2"
    assert raw.headers["x-kvasir-route-reason"] == "the message says 'code'"
    assert raw.parse().model == "qwen2"
    chat = [{"role": "user", "content": "Hello"}]
    raw = client.chat.completions.with_raw_response.create(model="auto", messages=chat, max_tokens=4, stream=True)
    assert raw.headers["x-kvasir-routed-to"] == "llama"
    assert [c.model for c in raw.parse()][0] == "llama"
    # the next turn of that conversation stays on its model even though it now mentions code
    chat += [{"role": "assistant", "content": "Hi"}, {"role": "user", "content": "Now some code"}]
    raw = client.chat.completions.with_raw_response.create(model="auto", messages=chat, max_tokens=4)
    assert raw.headers["x-kvasir-routed-to"] == "llama"
    assert raw.headers["x-kvasir-route-reason"] == "earlier turns of this conversation ran on llama"


def test_going_back_to_a_model_computes_none_of_its_earlier_turns_again(two_models):
    """A chat on one model, a request on the other, then the chat's next turn: the first model's prefix cache
    still holds every whole block of the earlier turn."""
    first = list(range(100, 140))

    async def turn(prompt, model):
        return (await collect(two_models.stream(prompt, GREEDY, model=model)))[-1]

    async def main():
        reply = await turn(first, "llama")
        await turn(list(range(200, 260)), "qwen2")
        return reply, await turn(first + list(reply.token_ids) + [7, 8, 9], "llama")

    reply, again = asyncio.run(main())
    computed = len(first) + len(reply.token_ids) - 1  # the last token of a reply is sampled, never computed
    assert again.metrics.cached_prompt_tokens == computed // 16 * 16 == 48


def test_metrics_give_every_resident_model_its_own_samples(client):
    import urllib.request

    url = str(client.base_url).removesuffix("/").removesuffix("/v1")
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        lines = response.read().decode().splitlines()
    running = [line for line in lines if line.startswith("kvasir:num_requests_running{")]
    assert running == ['kvasir:num_requests_running{model_name="llama"} 0.0',
                       'kvasir:num_requests_running{model_name="qwen2"} 0.0']


# -- loading on demand ------------------------------------------------------------------------------------


class Fit:
    """A stand-in fit estimate: fits once at least ``needed`` bytes would be freed."""

    def __init__(self, needed: int) -> None:
        self.needed, self.asked = needed, []

    def __call__(self, config, reclaimable_bytes=0):
        self.asked.append((config.model, reclaimable_bytes))
        return types.SimpleNamespace(fits=reclaimable_bytes >= self.needed)


@pytest.fixture
def on_demand(tiny_model_dirs, tmp_path):
    """A server over llama alone whose library also holds qwen2 and mistral, loaded when a request names them."""
    library = ModelLibrary(tmp_path / "library")
    for arch in ("qwen2", "mistral"):
        library.add(str(tiny_model_dirs[arch]), download=False)
    engine = AsyncEngine(tiny_config(tiny_model_dirs["llama"]))
    fit = Fit(0)
    server = ApiServer(lambda: engine, ApiConfig(port=0),
                       loader=OnDemandModels(tiny_config(tiny_model_dirs["llama"]), library, estimate=fit))
    server.start()
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    yield engine, client, fit
    server.stop()
    engine.shutdown()


def test_models_lists_the_loaded_and_the_loadable(on_demand):
    engine, client, _ = on_demand
    listed = {m.id: m.status["value"] for m in client.models.list().data}
    assert listed == {"llama": "loaded", "SmolLM2-135M-Instruct": "unloaded", "qwen2": "unloaded",
                      "mistral": "unloaded"}
    assert client.models.retrieve("qwen2").status == {"value": "unloaded"}


def test_a_library_model_a_request_names_is_loaded_once(on_demand, oracles):
    engine, client, _ = on_demand

    def ask(_):
        return client.completions.create(model="qwen2", prompt="The sky is", max_tokens=24, temperature=0)

    with ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(ask, range(3)))  # three requests while it loads: one load
    expected = oracles["qwen2"].generate(["The sky is"], GREEDY)[0].text
    assert [(r.model, r.choices[0].text) for r in replies] == [("qwen2", expected)] * 3
    assert engine.model_ids() == ["llama", "qwen2"]
    assert {m.id: m.status["value"] for m in client.models.list().data}["qwen2"] == "loaded"


def test_room_is_made_from_the_least_recently_used_idle_model(on_demand):
    engine, client, fit = on_demand
    client.completions.create(model="qwen2", prompt="hi", max_tokens=2)
    qwen2 = engine.stats("qwen2")
    fit.needed = 1  # from now on a model fits only where another's memory is freed first
    reply = client.completions.create(model="mistral", prompt="hi", max_tokens=2)
    assert reply.model == "mistral" and engine.model_ids() == ["llama", "mistral"]  # qwen2 went, never llama
    (first, freed_first), (again, freed) = fit.asked[-2:]
    assert first == again and first.endswith("mistral")
    assert (freed_first, freed) == (0, qwen2.model_memory_bytes + qwen2.kv_cache_memory_bytes)


def test_no_room_and_no_such_model_are_said_in_words(on_demand):
    engine, client, fit = on_demand
    fit.needed = 10**15
    with pytest.raises(openai.APIStatusError) as caught:
        client.completions.create(model="qwen2", prompt="hi", max_tokens=2)
    assert caught.value.status_code == 503 and "does not fit in memory beside the models loaded now" in str(
        caught.value)
    with pytest.raises(openai.NotFoundError) as caught:
        client.completions.create(model="nope", prompt="hi", max_tokens=2)
    served = "this server serves 'llama', 'SmolLM2-135M-Instruct', 'mistral', 'qwen2'"  # the library newest first
    assert served in str(caught.value)
    assert engine.model_ids() == ["llama"]
