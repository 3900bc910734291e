"""Speculative decoding changes how fast a reply comes, never what it says: greedy and seeded replies are the
same token for token with drafts as without, on every architecture and through everything the scheduler does
(chunked prefill, prefix hits, preemption, stop strings, ``max_tokens`` inside a drafted run), and the pool's
invariants hold.

The drafts here come from an oracle that knows the plain replies and spoils some of their tokens, so every step
has drafts that are right for a while and then wrong: the verification, not the lookup, is under test (the
lookup has tests of its own, and the default model's tests run it on real text).
"""

import math
from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import Engine, EngineConfig, SamplingParams
from engine.step.detokenizer import REPLACEMENT
from engine.step.sampler import Sampler
from tests.helpers.draft_oracle import with_oracle
from tests.helpers.pool import assert_preempted_cached_and_drained
from tests.helpers.tiny_models import ARCHITECTURES, write_tiny_model

PROMPTS = [
    "one two three four one two three four one two three",
    "def add(a, b):\n    return a + b\n\ndef add(a, b):\n",
    "The same words, the same words, the same",
]


def _engine(folder, speculation: str = "off", **overrides) -> Engine:
    settings = dict(model=str(folder), num_kv_blocks=64, dtype="float32", kv_disk_cache=False,
                    speculation=speculation)
    return Engine(EngineConfig(**{**settings, **overrides}))


def _drafted(outputs) -> tuple[int, int]:
    return (sum(o.metrics.draft_tokens for o in outputs), sum(o.metrics.accepted_draft_tokens for o in outputs))


def _check_same(plain, drafted) -> None:
    assert [o.token_ids for o in drafted] == [o.token_ids for o in plain]
    assert [o.text for o in drafted] == [o.text for o in plain]
    assert [o.finish_reason for o in drafted] == [o.finish_reason for o in plain]
    tokens, kept = _drafted(drafted)
    assert 0 < kept < tokens  # drafts were computed, some kept and some not


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_greedy_replies_are_the_same_with_drafts(tiny_model_dirs, arch):
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    plain = _engine(tiny_model_dirs[arch]).generate(PROMPTS, params)
    engine = _engine(tiny_model_dirs[arch], "ngram")
    with_oracle(engine, plain, PROMPTS)
    _check_same(plain, engine.generate(PROMPTS, params))
    assert _drafted(plain) == (0, 0)


def test_the_text_of_kept_draft_tokens_is_marked(tiny_llama):
    """Each step's run is its kept draft tokens and then the model's own token: the reply marks the characters of
    the kept ones, touching ranges joined, the model's own never. (A character whose bytes two tokens share is
    the one's that completes it: text is shown a whole character at a time.)"""
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    plain = _engine(tiny_llama).generate(PROMPTS, params)
    assert all(o.kept_draft_spans == () for o in plain)
    engine = _engine(tiny_llama, "ngram")
    with_oracle(engine, plain, PROMPTS)
    runs, append_run = {}, engine._append_run
    engine._append_run = lambda seq, tokens, now: runs.setdefault(seq.request_id, []).append(list(tokens)) or \
        append_run(seq, tokens, now)
    drafted = engine.generate(PROMPTS, params)
    decode = engine.tokenizer.decode
    for out in drafted:
        expected, done, shown = [], [], 0
        for run in runs[out.request_id]:
            for position, token in enumerate(run):
                start = shown
                done.append(token)
                text = decode(done, skip_special_tokens=True)
                if not text.endswith(REPLACEMENT):  # half a character waits for the token that completes it
                    shown = len(text)
                if position < len(run) - 1 and shown > start:
                    if expected and expected[-1][1] == start:
                        start = expected.pop()[0]
                    expected.append((start, shown))
        assert list(out.kept_draft_spans) == expected
        marked = sum(end - start for start, end in out.kept_draft_spans)
        assert marked < len(out.text)
    assert sum(len(o.kept_draft_spans) for o in drafted) > 0


@pytest.fixture(scope="module")
def echo_llama(tmp_path_factory, tokenizer_dir):
    """A tiny llama whose output head is its embedding: it would say its last token for ever, so a repetition
    penalty decides each token, and a penalty that missed a drafted token would change the reply."""
    return write_tiny_model("llama", tmp_path_factory.mktemp("echo"), tokenizer_dir, tie_word_embeddings=True)


def test_seeded_and_penalised_replies_are_the_same_with_drafts(echo_llama):
    params = [SamplingParams(max_tokens=40, temperature=0.9, top_p=0.95, top_k=40, repetition_penalty=3.0, seed=1),
              SamplingParams(max_tokens=40, temperature=0.7, min_p=0.05, seed=2),
              SamplingParams(max_tokens=40, temperature=0.0, repetition_penalty=3.0)]  # greedy, penalised
    plain = _engine(echo_llama).generate(PROMPTS, params)
    engine = _engine(echo_llama, "ngram")
    with_oracle(engine, plain, PROMPTS)
    _check_same(plain, engine.generate(PROMPTS, params))


def test_chunked_prefill_prefix_hits_and_preemption_change_nothing(tiny_llama):
    """A pool of 12 blocks for three 60-token replies preempts; 8-token prompt chunks; the second round's
    prompts extend the first round's, so they start from cached blocks."""
    params = SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    settings = dict(num_kv_blocks=12, max_num_batched_tokens=8)
    first = _engine(tiny_llama).generate(PROMPTS, params)
    follow = [p + "".join(o.text) + " and again" for p, o in zip(PROMPTS, first, strict=True)]
    plain_engine = _engine(tiny_llama, **settings)
    plain = plain_engine.generate(PROMPTS, params) + plain_engine.generate(follow, params)
    engine = _engine(tiny_llama, "ngram", **settings)
    with_oracle(engine, plain, PROMPTS + follow)
    drafted = engine.generate(PROMPTS, params) + engine.generate(follow, params)
    _check_same(plain, drafted)
    assert_preempted_cached_and_drained(engine.stats())


def test_stops_and_max_tokens_inside_a_drafted_run_end_the_reply_where_they_would(tiny_llama):
    greedy = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    reference = _engine(tiny_llama).generate(PROMPTS, greedy)
    # a stop string and a stop token from the middle of each plain reply, and max_tokens short of its end
    cases = []
    for prompt, out in zip(PROMPTS, reference, strict=True):
        cases += [(prompt, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True, stop=(out.text[30:34],))),
                  (prompt, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True,
                                          stop_token_ids=(out.token_ids[17],))),
                  (prompt, SamplingParams(max_tokens=13, temperature=0.0, ignore_eos=True))]
    prompts, params = [c[0] for c in cases], [c[1] for c in cases]
    plain = _engine(tiny_llama).generate(prompts, params)
    engine = _engine(tiny_llama, "ngram")
    oracle = with_oracle(engine, reference, PROMPTS, spoil=0.05)  # long runs of right drafts
    drafted = engine.generate(prompts, params)
    assert oracle.proposed > 0
    assert [(o.token_ids, o.text, o.finish_reason) for o in drafted] == \
        [(o.token_ids, o.text, o.finish_reason) for o in plain]
    assert all(o.metrics.output_tokens <= 13 for o in drafted[2::3])


def test_streamed_deltas_add_up_to_the_reply(tiny_llama):
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    plain = _engine(tiny_llama).generate(PROMPTS[:1], params)
    engine = _engine(tiny_llama, "ngram")
    with_oracle(engine, plain, PROMPTS[:1], spoil=0.1)
    engine.add_request(PROMPTS[0], params)
    ids, text, sizes = [], "", []
    while engine.has_unfinished():
        for out in engine.step():
            ids += out.delta_token_ids
            text += out.delta_text
            sizes.append(len(out.delta_token_ids))
    assert ids == plain[0].token_ids and text == plain[0].text
    assert max(sizes) > 1  # some steps gave several tokens at once


class FixedDraft:
    """Proposes the same one token after every prefix."""

    def __init__(self, token: int) -> None:
        self.token = token
        self.proposed = 0

    def propose(self, request_id: str, tokens: list[int], length: int) -> list[int]:
        self.proposed += 1
        return [self.token][:length]

    def finish(self, request_id: str) -> None:
        pass


def _chi_square_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for a chi-square variable with an even number of degrees of freedom."""
    assert dof % 2 == 0
    half, term, total = statistic / 2, 1.0, 0.0
    for i in range(dof // 2):
        term = 1.0 if i == 0 else term * half / i
        total += term
    return math.exp(-half) * total


@torch.inference_mode()
def test_sampled_replies_follow_the_model_distribution_with_drafts(tiny_llama):
    """1,500 replies (temperature 1, top-k 3) with a one-token draft at the second token, kept or resampled:
    the nine (first, second) pairs' counts against the model's own probabilities, computed by
    transformers on each prefix. A chi-square goodness-of-fit test, 8 degrees of freedom, at fixed seeds."""
    prompt = "The same words, the same words, the same"
    reference = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()
    engine = _engine(tiny_llama, "ngram", max_num_seqs=256, num_kv_blocks=600)
    ids = engine.encode_prompt(prompt)

    def top3(prefix: list[int]) -> dict[int, float]:
        logits = reference(torch.tensor([prefix])).logits[0, -1].double()
        values, tokens = logits.topk(3)
        return dict(zip(tokens.tolist(), torch.softmax(values, dim=0).tolist(), strict=True))

    first = top3(ids)
    expected = {(a, b): pa * pb for a, pa in first.items() for b, pb in top3(ids + [a]).items()}
    likely = max(first, key=first.get)
    draft = max(top3(ids + [likely]).items(), key=lambda item: item[1])[0]
    engine.speculator.proposer = FixedDraft(draft)  # right as often as the model says; wrong after the others
    engine.runner.sampler = Sampler(seed=1234)
    samples = 1500
    params = SamplingParams(max_tokens=3, temperature=1.0, top_k=3, ignore_eos=True)  # room for the draft
    outputs = engine.generate([ids] * samples, params)
    counts = Counter(tuple(o.token_ids[:2]) for o in outputs)
    assert set(counts) <= set(expected)
    statistic = sum((counts[pair] - samples * p) ** 2 / (samples * p) for pair, p in expected.items())
    assert _chi_square_sf(statistic, len(expected) - 1) > 0.001, (statistic, counts, expected)
    drafted, kept = _drafted(outputs)
    assert drafted == samples  # every second token was drafted
    accepted = sum(p_first * top3(ids + [a]).get(draft, 0.0) for a, p_first in first.items())
    assert abs(kept - samples * accepted) < 5 * math.sqrt(samples * accepted * (1 - accepted))  # kept as p(draft)


def test_the_mode_changes_between_steps_and_a_wrong_one_is_refused(tiny_llama):
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    plain = _engine(tiny_llama).generate(PROMPTS[:1], params)
    engine = _engine(tiny_llama, "ngram")
    with_oracle(engine, plain, PROMPTS[:1])
    engine.set_speculation("off")
    assert _drafted(engine.generate(PROMPTS[:1], params)) == (0, 0)
    assert engine.stats().speculation.mode == "off" and engine.config.speculation == "off"
    with pytest.raises(ValueError, match="speculation must be one of"):
        engine.set_speculation("sometimes")
    with pytest.raises(ValueError, match="draft model"):
        engine.set_speculation("draft")
    assert engine.stats().speculation.mode == "off"
    engine.set_speculation("ngram")
    drafted = engine.generate(PROMPTS[:1], params)
    assert drafted[0].token_ids == plain[0].token_ids and _drafted(drafted)[0] > 0
    stats = engine.stats().speculation
    assert (stats.draft_tokens_total, stats.accepted_draft_tokens_total) == _drafted(drafted)
