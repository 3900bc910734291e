"""A scripted stand-in for the engine bridge, for testing the UI logic without a model."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future

from PySide6.QtCore import QObject, Signal

from engine import Chat, EngineDeadError, EngineStats, RequestMetrics, RequestOutput, Structure
from engine.templates.tool_calls import ToolCall

WORDS = "Paris is the capital of France and a **lovely** city .".split()


def fake_stats(**overrides) -> EngineStats:
    values = dict(
        block_size=16, kv_blocks_total=64, kv_blocks_used=10, kv_blocks_cached=6, kv_blocks_free=48,
        kv_blocks_shared=3, kv_usage=10 / 64, prefix_hit_rate=0.42, num_running=2, num_waiting=1,
        num_preempted_total=5, prompt_tokens_total=900, cached_prompt_tokens_total=378, generated_tokens_total=320,
        prefill_tokens_per_s=850.0, decode_tokens_per_s=23.5, device="cpu", device_reason="no CUDA GPU found",
        dtype="float32", quantization="none", attention_backend="torch", model_name="Fake-1M",
        model_memory_bytes=3 * 1024**2, kv_cache_memory_bytes=1024**2, max_model_len=2048,
    )
    values.update(overrides)
    return EngineStats(**values)


class FakeBridge(QObject):
    """A :class:`app.engines.bridge.ChatEngine` that streams ``WORDS`` one per tick; ``gate`` (an asyncio.Event) can
    hold a stream mid-way. With ``thoughts``, a thinking model's reply: those words first, one per tick, as its
    reasoning (``delta_reasoning``), then the answer's words.

    ``tool_calls``: the calls (engine ``ToolCall``s) each reply in turn ends with, one tuple a reply (replies past
    the list call nothing). A reply held to a call (its sampling carries ``forced_call``'s structure) ends with a
    call of the tool named there, or of the first tool offered, as the engine's constrained decoding guarantees.

    ``fail(reason)`` makes the engine die as the real one can; ``fail_load(reason)`` makes a load fail."""

    load_progress = Signal(float, str)
    loaded = Signal(object)
    load_failed = Signal(str)
    stats_updated = Signal(object)
    models_updated = Signal(object)
    engine_failed = Signal(str)

    def __init__(self, words=WORDS, finish_reason="stop", kept_words: frozenset[int] = frozenset(),
                 thoughts=(), tool_calls=()) -> None:
        super().__init__()
        self.tool_calls = [tuple(calls) for calls in tool_calls]
        self.words, self.finish_reason = list(words), finish_reason
        self.thoughts = list(thoughts)
        self.kept_words = kept_words  # the words that came from kept drafts (RequestOutput.kept_draft_spans)
        self.ready, self.loading, self.serving = True, False, True
        self.config = None
        self.failure: str | None = None
        self.load_error: str | None = None
        self.requests: list[list[dict]] = []  # the messages of every reply asked for
        self.prompts: list = []  # every prompt as given to stream (a Chat, or a list of messages)
        self.samplings: list = []  # every request's SamplingParams, as given to stream
        self.forced: list = []  # (tool name or None, model) of every forced_call
        self._forcing: list = []  # (structure, the tool its call names) of every forced_call
        self.counted: list = []  # every prompt as given to count_tokens
        self.restarts = 0
        self.cpu_options: tuple | None = None  # what set_cpu_options was last given
        self.speculation: str | None = None  # what set_speculation was last given
        self.gate: asyncio.Event | None = None
        self.streams = 0
        self.token_counts = 0  # how many times count_tokens ran
        self._stats = fake_stats()
        self.engine = self  # what the router asks which models are resident: this bridge's one model

    focused = "Fake-1M"  # one resident model

    @property
    def resident(self) -> dict:
        return {self.focused: self.config}

    def model_ids(self) -> list[str]:
        return [self.focused]

    def model_id(self, name: str | None = None) -> str:
        if name not in (None, self.focused):
            raise LookupError(f"no resident model answers to {name}")
        return self.focused

    def resident_id(self, config) -> str | None:
        same = self.config is not None and (config.model, config.quantization) == (
            self.config.model, self.config.quantization)
        return self.focused if same else None

    def focus(self, model) -> None:
        self.loaded.emit(self._stats)

    def reloads(self, config) -> bool:
        from app.engines.bridge import load_options

        return self.resident_id(config) is not None and load_options(config) != load_options(self.config)

    def room_for(self, config) -> list[str]:
        return []

    async def show(self, config) -> None:
        await self.switch(config)

    async def unload(self, model) -> None:
        raise ValueError(f"{model} is the only model loaded")

    def stats(self, model=None) -> EngineStats:
        return self._stats

    def all_stats(self) -> dict:
        return {self.focused: self._stats}

    def count_tokens(self, messages, model=None) -> int:
        """Words plus 4 a message (reasoning included), and 3 more where the template is asked not to think."""
        self.token_counts += 1
        self.counted.append(messages)
        chat = messages if isinstance(messages, Chat) else Chat(messages)
        words = sum(len((m["content"] + " " + m.get("reasoning_content", "")).split()) + 4 for m in chat.messages)
        return words + (3 if chat.options.get("enable_thinking") is False else 0)

    def start(self, config) -> None:
        self.config = config
        self._serve()

    async def switch(self, config) -> None:
        self.config = config
        self._serve()

    def restart(self) -> None:
        self.restarts += 1
        self._serve()

    def set_cpu_options(self, threads, lower_priority) -> None:
        self.cpu_options = (threads, lower_priority)

    def set_idle_unload(self, seconds) -> None:
        self.idle_unload_s = seconds

    def set_speculation(self, mode) -> None:
        self.speculation = mode

    def clear_disk_cache(self) -> Future:
        """A finished clearing that freed 3 MiB."""
        done = Future()
        done.set_result(3 * 1024**2)
        return done

    def check_kv_formats(self) -> Future:
        """A finished check, with figures for two formats (as the engine's check gives them)."""
        from engine import KVQuality

        done = Future()
        done.set_result([KVQuality("float32", 0.0, 1.0, 20.0, 1024), KVQuality("q8_0", 0.0091, 0.944, 20.3, 272)])
        return done

    def shutdown(self) -> None:
        pass

    def fail(self, reason: str) -> None:
        """The engine thread dies: open streams end with EngineDeadError, new ones raise it at once."""
        self.failure, self.ready, self.serving = reason, False, False
        if self.gate is not None:
            self.gate.set()  # wake a held stream so that it sees the failure
        self.engine_failed.emit(reason)

    def fail_load(self, reason: str) -> None:
        """The model could not be loaded, and no engine serves."""
        self.load_error, self.ready, self.serving = reason, False, False
        self.load_failed.emit(reason)

    def fail_load_keeping_the_model(self, reason: str) -> None:
        """A switch failed; the previous model still serves."""
        self.load_error = reason
        self.load_failed.emit(reason)

    def _serve(self) -> None:
        self.failure = self.load_error = None
        self.ready = self.serving = True
        self.loaded.emit(self._stats)

    def forced_call(self, tools, name, model=None) -> Structure:
        self.forced.append((name, model))
        structure = Structure("grammar", f"start: one call of {name or 'any tool'}")
        self._forcing.append((structure, name or tools[0]["function"]["name"]))
        return structure

    def stream(self, messages, sampling, model=None) -> FakeStream:
        if self.failure is not None:
            raise EngineDeadError(self.failure)
        self.prompts.append(messages)
        self.samplings.append(sampling)
        self.requests.append(list(messages.messages) if isinstance(messages, Chat) else messages)
        calls = self.tool_calls[self.streams] if self.streams < len(self.tool_calls) else ()
        forced = next((tool for s, tool in self._forcing if s is sampling.structure), None)
        if forced is not None and not calls:
            calls = (ToolCall(f"call-{self.streams}", forced, "{}"),)
        self.streams += 1
        return FakeStream(f"fake-{self.streams}", self._stream(calls))

    async def _stream(self, calls=()):
        text, spans, reasoning = "", [], ""
        pieces = [("thought", word) for word in self.thoughts] + [("word", word) for word in self.words]
        for i, (kind, word) in enumerate(pieces):
            if self.gate is not None and i == 2:
                await self.gate.wait()
            await asyncio.sleep(0)
            if self.failure is not None:
                raise EngineDeadError(self.failure)
            j = i - len(self.thoughts)  # the answer word's index
            if kind == "thought":
                reasoning += ("" if i == 0 else " ") + word
            else:
                text += ("" if j == 0 else " ") + word
            if kind == "word" and j in self.kept_words and word:
                spans.append((len(text) - len(word), len(text)))
            last = i == len(pieces) - 1
            yield _output(text, i + 1, self.finish_reason if last else None, tuple(spans), reasoning,
                          len(self.thoughts) if kind == "word" else i + 1, calls if last else ())


class FakeStream:
    """What ``stream`` returns: the request's id and its outputs."""

    def __init__(self, request_id: str, outputs) -> None:
        self.request_id = request_id
        self._outputs = outputs

    def __aiter__(self):
        return self._outputs


THOUGHT_S = 0.1  # seconds a fake reply's reasoning takes, a thought


def _output(text: str, n: int, reason: str | None, kept_draft_spans=(), reasoning: str = "",
            thought_tokens: int = 0, tool_calls=()) -> RequestOutput:
    metrics = RequestMetrics(queue_time_s=0.001, ttft_s=0.05, prompt_tokens=40, cached_prompt_tokens=32,
                             output_tokens=n, decode_tokens_per_s=25.0 if n > 1 else None,
                             reasoning_tokens=thought_tokens,
                             reasoning_s=round(thought_tokens * THOUGHT_S, 6) if thought_tokens else None)
    delta_text = text.split(" ")[-1] if n > thought_tokens else ""
    delta_reasoning = reasoning.split(" ")[-1] if n <= thought_tokens else ""
    return RequestOutput("fake", text, list(range(n)), delta_text, [n], reason is not None, reason, None,
                         metrics, kept_draft_spans, reasoning, delta_reasoning, tuple(tool_calls), tuple(tool_calls))
