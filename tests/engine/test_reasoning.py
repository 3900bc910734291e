"""A thinking model's replies on the real engine: reasoning and answer apart as they stream, the template's
switch, the token count and time of the reasoning, and earlier reasoning sent again only where the template says.

The tiny random model never writes ``</think>`` by itself, so one test renames, in a copy of its tokenizer, the
token its greedy reply has at a chosen place: the weights, and so the reply's tokens, stay the same.
"""

import pytest
from transformers import AutoTokenizer

from engine import Chat, Engine, EngineConfig, SamplingParams
from tests.helpers.reasoning_models import (
    KEEPING_TEMPLATE,
    MAGISTRAL_TEMPLATE,
    THINK_TEMPLATE,
    closing_model,
    with_template,
)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def think_model(tiny_llama, tmp_path_factory):
    return with_template(tiny_llama, tmp_path_factory.mktemp("think") / "model", THINK_TEMPLATE)


def engine_for(model) -> Engine:
    return Engine(EngineConfig(model=str(model), num_kv_blocks=64, kv_disk_cache=False, speculation="off"))


def streamed(engine, prompt, params=GREEDY):
    """Every output of one request, step by step."""
    request_id = engine.add_request(prompt, params)
    outputs = []
    while not outputs or not outputs[-1].finished:
        outputs += [o for o in engine.step() if o.request_id == request_id]
    return outputs


def joined(outputs):
    return "".join(o.delta_text for o in outputs), "".join(o.delta_reasoning for o in outputs)


def test_a_reply_the_template_starts_thinking_is_all_reasoning_until_it_closes(think_model):
    engine = engine_for(think_model)
    stats = engine.stats()
    assert stats.reasoning_markers == "<think>…</think>" and stats.thinking_switch and not stats.reasoning_note
    outputs = streamed(engine, Chat(QUESTION))
    final = outputs[-1]
    text = engine.tokenizer.decode(final.token_ids, skip_special_tokens=True)
    assert "</think>" not in text  # the random model never closes the block
    assert final.text == "" and final.reasoning == text.strip()
    assert joined(outputs) == ("", final.reasoning)
    assert final.metrics.reasoning_tokens == GREEDY.max_tokens and final.metrics.reasoning_s > 0
    assert "thought for" in final.metrics.summary()


def test_thinking_off_closes_the_block_in_the_prompt_so_the_reply_is_all_answer(think_model):
    engine = engine_for(think_model)
    prompt_ids = engine.encode_prompt(Chat(QUESTION, {"enable_thinking": False}))
    assert engine.tokenizer.decode(prompt_ids).endswith("<think>\n\n</think>\n\n")
    outputs = streamed(engine, Chat(QUESTION, {"enable_thinking": False}))
    final = outputs[-1]
    assert final.reasoning == "" and final.metrics.reasoning_tokens == 0 and final.metrics.reasoning_s is None
    assert final.text == engine.tokenizer.decode(final.token_ids, skip_special_tokens=True)
    assert joined(outputs) == (final.text, "")


def test_the_end_marker_splits_the_reply_where_the_model_writes_it(think_model, tmp_path):
    plain = engine_for(think_model)
    prompt_ids = plain.encode_prompt(Chat(QUESTION))
    ids = plain.generate([prompt_ids], GREEDY)[0].token_ids
    folder, place = closing_model(think_model, tmp_path / "renamed", prompt_ids, ids)
    renamed = engine_for(folder)
    outputs = streamed(renamed, Chat(QUESTION))
    final = outputs[-1]
    assert final.token_ids == ids  # the same weights write the same tokens
    text = AutoTokenizer.from_pretrained(folder).decode(ids, skip_special_tokens=True)
    before, after = text.split("</think>")
    assert (final.reasoning, final.text) == (before.strip(), after.lstrip())
    assert joined(outputs) == (final.text, final.reasoning)
    assert final.metrics.reasoning_tokens == place + 1
    ended = next(i for i, o in enumerate(outputs) if o.delta_text)
    assert all(o.delta_reasoning == "" for o in outputs[ended:])  # the reasoning is done once the answer begins
    raw = renamed.generate([Chat(QUESTION)], SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True,
                                                           split_reasoning=False))[0]
    assert raw.text == text and raw.reasoning == ""  # a raw completion: the text as written


def test_earlier_reasoning_reaches_the_model_only_where_its_template_renders_it(tiny_llama, tmp_path):
    chat = [*QUESTION, {"role": "assistant", "content": "Paris.", "reasoning_content": "France's capital is Paris"},
            {"role": "user", "content": "And Spain?"}]
    dropping = engine_for(with_template(tiny_llama, tmp_path / "drops", THINK_TEMPLATE))
    keeping = engine_for(with_template(tiny_llama, tmp_path / "keeps", KEEPING_TEMPLATE))
    assert "France's capital" not in dropping.tokenizer.decode(dropping.encode_prompt(Chat(chat)))
    assert "<think>France's capital is Paris</think>Paris." in keeping.tokenizer.decode(
        keeping.encode_prompt(Chat(chat)))
    assert keeping.stats().reasoning_markers == "<think>…</think>" and not keeping.stats().thinking_switch


def test_magistral_markers_are_recognised(tiny_llama, tmp_path):
    engine = engine_for(with_template(tiny_llama, tmp_path / "magistral", MAGISTRAL_TEMPLATE))
    final = engine.generate([Chat(QUESTION)], GREEDY)[0]
    assert engine.stats().reasoning_markers == "[THINK]…[/THINK]" and final.text == "" and final.reasoning


def test_a_model_without_markers_answers_as_before_and_bad_options_are_refused(tiny_llama):
    engine = engine_for(tiny_llama)
    assert engine.stats().reasoning_markers == "" and not engine.stats().thinking_switch
    final = engine.generate([Chat(QUESTION)], GREEDY)[0]
    assert final.reasoning == "" and final.text == engine.tokenizer.decode(final.token_ids, skip_special_tokens=True)
    for options, words in [({"messages": []}, "template's own"), ({"1x": True}, "not a name"),
                           ({"f": object()}, "text, numbers"), (["enable_thinking"], "mapping")]:
        with pytest.raises(ValueError, match=words):
            engine.encode_prompt(Chat(QUESTION, options))
    with pytest.raises(ValueError, match="at least one message"):
        engine.encode_prompt(Chat([]))


def test_the_next_turn_reads_the_earlier_turns_from_the_prefix_cache_though_the_template_drops_reasoning(
        think_model, tmp_path):
    """Each turn's prompt is the previous prompt, less the block its generation prompt opened, then the reply
    without its reasoning and the next question: everything before the reply comes from the cache (whole blocks),
    and only the reply's answer and the question are computed."""
    plain = engine_for(think_model)
    prompt_ids = plain.encode_prompt(Chat(QUESTION))
    ids = plain.generate([prompt_ids], GREEDY)[0].token_ids
    engine = engine_for(closing_model(think_model, tmp_path / "closing", prompt_ids, ids)[0])
    chat, opened = list(QUESTION), len(engine.tokenizer.encode("<think>\n", add_special_tokens=False))
    shares = []
    for turn in range(4):
        reply = engine.generate([Chat(chat)], GREEDY)[0]
        previous = len(engine.encode_prompt(Chat(chat)))
        chat += [{"role": "assistant", "content": reply.text, "reasoning_content": reply.reasoning},
                 {"role": "user", "content": f"Tell me more, part {turn + 2}."}]
        nxt = engine.generate([Chat(chat)], SamplingParams(max_tokens=1, temperature=0.0))[0].metrics
        block = engine.stats().block_size
        assert nxt.cached_prompt_tokens >= (previous - opened) // block * block
        shares.append(nxt.cached_prompt_tokens / nxt.prompt_tokens)
    print("share of each next prompt from the cache:", ", ".join(f"{s:.0%}" for s in shares))
    assert shares == sorted(shares)  # the longer the conversation, the more of it is cached
