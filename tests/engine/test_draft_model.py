"""A draft model beside the serving one: replies token for token the same as without it, through everything the
scheduler does; its KV in the same pool (a cached prefix is cached for it too, freeing frees both); its memory
counted before loading and after; a draft whose tokenizer differs refused in words.

The drafts come from the same tiny model quantised to int4: its greedy choices mostly agree with the float32
model's and sometimes not, so drafts are both kept and rejected.
"""

import pytest

from engine import Engine, EngineConfig, SamplingParams
from engine.errors import ModelLoadError
from engine.models.fit import estimate
from engine.serving.draft_model import DraftModel
from engine.serving.draft_trials import FIRST_WAIT, TRIAL_STEPS
from engine.serving.speculation import HINTS
from tests.helpers.pool import assert_preempted_cached_and_drained
from tests.helpers.tiny_models import ARCHITECTURES

PROMPTS = [
    "one two three four one two three four one two three",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "The same words, the same words, the same",
]
GREEDY = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)


def _engine(folder, speculation: str = "off", **overrides) -> Engine:
    settings = dict(model=str(folder), num_kv_blocks=64, dtype="float32", kv_disk_cache=False,
                    speculation=speculation)
    if speculation == "draft":
        settings.update(draft_model=str(folder), draft_quantization="int4")
    return Engine(EngineConfig(**{**settings, **overrides}))


def _drafted(outputs) -> tuple[int, int]:
    return (sum(o.metrics.draft_tokens for o in outputs), sum(o.metrics.accepted_draft_tokens for o in outputs))


def _check_same(plain, drafted) -> None:
    assert [(o.token_ids, o.text, o.finish_reason) for o in drafted] == \
        [(o.token_ids, o.text, o.finish_reason) for o in plain]
    tokens, kept = _drafted(drafted)
    assert 0 < kept < tokens  # drafts were written, some kept and some not


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_greedy_replies_are_the_same_with_a_draft_model(tiny_model_dirs, arch):
    plain = _engine(tiny_model_dirs[arch]).generate(PROMPTS, GREEDY)
    engine = _engine(tiny_model_dirs[arch], "draft")
    _check_same(plain, engine.generate(PROMPTS, GREEDY))
    stats = engine.stats()
    assert stats.speculation.draft_model.endswith("(int4)")
    assert stats.kv_blocks_used == 0


def _pass_roundings(engine: Engine, prompts) -> list[tuple[int, int, bool]]:
    """(replies, positions, fine activations) of each of the draft model's passes while ``prompts`` are answered."""
    draft, seen = engine.draft, []
    original = draft._pass

    def recorded(rows):
        chosen = original(rows)
        fine = getattr(draft.runner.lean, "fine_activations", False)
        seen.append((len(rows), sum(len(row.tokens) + len(row.hint) for row in rows), fine))
        return chosen

    draft._pass = recorded
    engine.generate(prompts, GREEDY)
    return seen


def test_a_float_models_draft_rounds_a_lone_replys_activations_finely(tiny_llama):
    """The draft's 4-bit layers round activations to 8 bits; a float serving model's do not, so for one its draft
    rounds them to about 15 bits in passes of one reply (its prompt, drafts and hints), and keeps 8 in passes of
    several replies (where the remainder rows cost more than they give); for a 4-bit serving model always 8."""
    lone = _pass_roundings(_engine(tiny_llama, "draft"), PROMPTS[:1])
    assert lone and all(fine for _, _, fine in lone)
    assert any(positions > 8 for _, positions, _ in lone)  # the prompt too
    batch = _pass_roundings(_engine(tiny_llama, "draft"), PROMPTS)
    assert any(replies > 1 for replies, _, _ in batch)
    assert all(fine == (replies == 1) for replies, _, fine in batch)
    four_bit = _pass_roundings(_engine(tiny_llama, "draft", quantization="int4"), PROMPTS[:1])
    assert four_bit and not any(fine for _, _, fine in four_bit)


def test_seeded_and_stopped_replies_are_the_same_with_a_draft_model(tiny_llama):
    reference = _engine(tiny_llama).generate(PROMPTS, GREEDY)
    params = [SamplingParams(max_tokens=40, temperature=0.8, top_p=0.9, seed=3),
              SamplingParams(max_tokens=40, temperature=0.0, repetition_penalty=1.5, ignore_eos=True,
                             stop=(reference[1].text[20:24],)),
              SamplingParams(max_tokens=13, temperature=0.0, ignore_eos=True)]
    plain = _engine(tiny_llama).generate(PROMPTS, params)
    drafted = _engine(tiny_llama, "draft").generate(PROMPTS, params)
    assert [(o.token_ids, o.text, o.finish_reason) for o in drafted] == \
        [(o.token_ids, o.text, o.finish_reason) for o in plain]
    assert drafted[2].metrics.output_tokens == 13


def test_chunked_prefill_prefix_hits_and_preemption_change_nothing(tiny_llama):
    """12 blocks for three 60-token replies preempt; 8-token steps make the draft catch up a prompt over several
    steps; the second round's prompts extend the first's, so they start from cached blocks."""
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    settings = dict(num_kv_blocks=12, max_num_batched_tokens=8)
    first = _engine(tiny_llama).generate(PROMPTS, params)
    follow = [p + o.text + " and again" for p, o in zip(PROMPTS, first, strict=True)]
    plain_engine = _engine(tiny_llama, **settings)
    plain = plain_engine.generate(PROMPTS, params) + plain_engine.generate(follow, params)
    engine = _engine(tiny_llama, "draft", **settings)
    drafted = engine.generate(PROMPTS, params) + engine.generate(follow, params)
    _check_same(plain, drafted)
    assert_preempted_cached_and_drained(engine.stats())


class PassLog:
    """Records the positions each draft pass computes."""

    def __init__(self, draft: DraftModel) -> None:
        self.passes: list[list[tuple[int, int]]] = []
        self._pass = draft._pass
        draft._pass = self

    def __call__(self, rows):
        self.passes.append([(row.start, row.end) for row in rows])
        return self._pass(rows)


def test_a_cached_prefix_is_cached_for_the_draft_too(tiny_llama):
    """The next turn's prompt starts with the turn before: the draft's first pass starts where the blocks the
    draft computed before end, not at the start of the prompt."""
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    engine = _engine(tiny_llama, "draft")
    first = engine.generate(PROMPTS[:1], params)[0]
    follow = engine.encode_prompt(PROMPTS[0]) + list(first.token_ids) + engine.encode_prompt(" and then some more")
    log = PassLog(engine.draft)
    second = engine.generate([follow], params)[0]
    start, end = log.passes[0][0]
    cached = second.metrics.cached_prompt_tokens
    assert cached >= 32 and start >= cached - engine.block_size  # at most a block the draft skipped is redone
    assert end == second.metrics.prompt_tokens + 1  # up to the first token of the reply, drafting the second
    assert second.token_ids == _engine(tiny_llama).generate([follow], params)[0].token_ids


class DraftLog:
    """Records the drafts the draft model writes, step by step."""

    def __init__(self, draft: DraftModel) -> None:
        self.drafts: list[list[tuple[int, ...]]] = []
        self._fill = draft.fill
        draft.fill = self

    def __call__(self, chunks, blocks, budget):
        caught_up = self._fill(chunks, blocks, budget)
        self.drafts.append([chunk.draft for chunk in chunks])
        return caught_up


class ReplyGuesses:
    """Lookup standing in for text that repeats: it guesses each draft from the reply plain decoding wrote, every
    third guess with its second token wrong (the tiny model's replies never repeat, so real lookup finds none)."""

    def __init__(self, engine: Engine, replies) -> None:
        self.known = [(engine.encode_prompt(p), list(r.token_ids)) for p, r in zip(PROMPTS, replies, strict=True)]
        self.guesses = 0

    def propose(self, request_id, tokens, length):
        prompt, reply = next((p, r) for p, r in self.known if tokens[: len(p)] == p)
        guess = reply[len(tokens) - len(prompt) :][:length]
        self.guesses += 1
        if self.guesses % 3 == 0 and len(guess) > 1:
            guess[1] = (guess[1] + 1) % 1000
        return guess

    def finish(self, request_id):
        pass


def test_lookup_hints_write_the_same_drafts_in_fewer_passes(tiny_llama):
    """Lookup's guesses, checked by the draft model in its first pass, give every draft the tokens a pass per
    token gives, in fewer passes; a rejected guess's positions are written over, so the next drafts are the same
    too (and the replies those of plain decoding)."""
    plain = _engine(tiny_llama).generate(PROMPTS, GREEDY)
    runs = {}
    for hinted in (True, False):
        engine = _engine(tiny_llama, "draft")
        if hinted:
            engine.speculator.proposer = ReplyGuesses(engine, plain)
        else:
            engine.speculator.proposer.propose = lambda *args: []  # in "draft" mode lookup only gives hints
        drafts, passes = DraftLog(engine.draft), PassLog(engine.draft)
        _check_same(plain, engine.generate(PROMPTS, GREEDY))
        runs[hinted] = (drafts.drafts, len(passes.passes), engine.speculator.engine_acceptance[HINTS])
    (hinted_drafts, hinted_passes, hints), (drafts, passes, no_hints) = runs[True], runs[False]
    assert hinted_drafts == drafts
    assert no_hints.tried == 0 and 0 < hints.kept < hints.tried  # guesses were agreed with, and rejected
    assert hinted_passes < passes


def test_auto_with_a_draft_model_changes_nothing(tiny_llama):
    """Alone a reply weighs the draft model step by step; a batch tries it (after a stretch of plain steps, every
    reply drafts with it): neither changes a token."""
    params = SamplingParams(max_tokens=FIRST_WAIT + 8 * TRIAL_STEPS, temperature=0.0, ignore_eos=True)
    plain = _engine(tiny_llama).generate(PROMPTS, params)
    engine = _engine(tiny_llama, "auto", draft_model=str(tiny_llama), draft_quantization="int4")
    assert [o.token_ids for o in engine.generate(PROMPTS * 3, params)] == [o.token_ids for o in plain] * 3
    assert engine.speculator.engine_acceptance["model"].tried > 0 and engine.speculator.trials.pace is not None
    assert engine.stats().speculation.reason.startswith("auto (")


def test_the_draft_is_in_the_fit_estimate_and_the_memory_figures(tiny_llama):
    alone = estimate(EngineConfig(model=str(tiny_llama), dtype="float32", kv_cache_memory=2**22))
    draft_alone = estimate(EngineConfig(model=str(tiny_llama), dtype="float32", quantization="int4"))
    both = estimate(EngineConfig(model=str(tiny_llama), dtype="float32", kv_cache_memory=2**22,
                                 draft_model=str(tiny_llama), draft_quantization="int4"))
    assert both.weight_bytes == alone.weight_bytes + draft_alone.weight_bytes
    # the same shape: the target's float32, the draft's float16 (draft_kv_format)
    assert both.kv_bytes_per_token == alone.kv_bytes_per_token * 3 // 2
    assert both.kv_tokens < alone.kv_tokens  # the same memory holds two thirds of the tokens
    assert "draft model" in both.summary()
    plain = _engine(tiny_llama, kv_cache_memory=2**22, num_kv_blocks=None)
    engine = _engine(tiny_llama, "draft", kv_cache_memory=2**22, num_kv_blocks=None)
    assert engine.kv_cache.num_blocks == plain.kv_cache.num_blocks * 2 // 3
    assert engine.draft.kv_cache.memory_bytes == engine.kv_cache.memory_bytes // 2
    stats, plain_stats = engine.stats(), plain.stats()
    assert stats.kv_cache_memory_bytes == engine.kv_cache.memory_bytes + engine.draft.kv_cache.memory_bytes
    assert stats.model_memory_bytes == plain_stats.model_memory_bytes + engine.draft.loaded.memory_bytes
    assert stats.speculation.draft_memory_bytes == (engine.draft.loaded.memory_bytes +
                                                    engine.draft.kv_cache.memory_bytes)


def test_a_draft_with_another_tokenizer_is_refused_in_words(tiny_llama, other_tokenizer_model):
    with pytest.raises(ModelLoadError, match="cannot draft for this model: its tokenizer is not the serving"):
        _engine(tiny_llama, "draft", draft_model=str(other_tokenizer_model))
    engine = _engine(tiny_llama)
    with pytest.raises(ModelLoadError, match="cannot draft"):
        engine.switch_model(EngineConfig(model=str(tiny_llama), num_kv_blocks=64, dtype="float32",
                                         kv_disk_cache=False, draft_model=str(other_tokenizer_model)))
    assert engine.draft is None and engine.generate(PROMPTS[:1], GREEDY)[0].token_ids  # the model serves on


def test_a_draft_mode_needs_a_draft_model():
    with pytest.raises(ValueError, match="needs a draft model"):
        EngineConfig(speculation="draft")
    with pytest.raises(ValueError, match="draft_quantization must be one of"):
        EngineConfig(draft_model="default", draft_quantization="int3")
    with pytest.raises(ValueError, match="draft_model must be"):
        EngineConfig(draft_model="  ")


def test_a_missing_draft_model_is_refused_in_words(tiny_llama, tmp_path):
    with pytest.raises(ModelLoadError, match="no model at"):
        _engine(tiny_llama, "draft", draft_model=str(tmp_path / "nowhere"))


def test_blocks_read_from_the_disk_tier_are_computed_by_the_draft_before_it_drafts(tiny_llama, tmp_path, monkeypatch):
    """The disk tier keeps the serving model's KV only: after a restart the draft computes the prompt itself
    (its first pass starts at 0), and the reply is the same."""
    monkeypatch.setenv("KVASIR_CACHE_DIR", str(tmp_path / "cache"))
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    first = _engine(tiny_llama, "draft", kv_disk_cache=True)
    prompt = first.encode_prompt(PROMPTS[1] * 3)
    before = first.generate([prompt], params)[0]
    first.close()
    follow = prompt + list(before.token_ids) + first.encode_prompt(" and more")
    restarted = _engine(tiny_llama, "draft", kv_disk_cache=True)
    log = PassLog(restarted.draft)
    again = restarted.generate([follow], params)[0]
    assert restarted.stats().disk_cache.hit_tokens_total == again.metrics.cached_prompt_tokens >= 32
    assert log.passes[0][0] == (0, again.metrics.prompt_tokens + 1)
    assert again.token_ids == _engine(tiny_llama).generate([follow], params)[0].token_ids


def test_the_command_line_names_a_draft_model():
    from engine.tools.cli import build_parser, config_from

    parser = build_parser()
    config = config_from(parser.parse_args(["serve", "--quant", "none", "--draft-model", "default",
                                            "--draft-quant", "int4", "--speculation", "draft"]))
    assert (config.quantization, config.draft_model, config.draft_quantization, config.speculation) == \
        ("none", "default", "int4", "draft")
    assert config_from(parser.parse_args(["serve"])).draft_model is None
