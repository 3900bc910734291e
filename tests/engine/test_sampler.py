"""The batched sampler against straightforward per-row definitions."""

import torch
from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

from engine.sampling_params import SamplingParams
from engine.step.sampler import Sampler, SamplingRow, _apply_repetition_penalty, _filtered_probs


def rows(*params, history=(1, 2, 3)):
    return [SamplingRow(p, list(history), 0) for p in params]


def test_greedy_rows_take_the_argmax():
    logits = torch.randn(4, 50)
    got = Sampler(0)(logits, rows(*[SamplingParams(temperature=0.0)] * 4))
    assert got == logits.argmax(-1).tolist()


def test_greedy_ties_take_the_first_largest_as_argmax_does():
    logits = torch.zeros(3, 49152)
    logits[0, [7, 300, 49000]] = 5.0  # three equal maxima
    logits[1, [49151, 2]] = 1.0
    logits[2, :] = -1.0  # all equal
    got = Sampler(0)(logits, rows(*[SamplingParams(temperature=0.0)] * 3))
    assert got == [7, 2, 0] == logits.argmax(-1).tolist()


def test_top_k_one_is_greedy_even_with_temperature():
    logits = torch.randn(3, 50)
    got = Sampler(0)(logits, rows(*[SamplingParams(temperature=1.5, top_k=1)] * 3))
    assert got == logits.argmax(-1).tolist()


def test_repetition_penalty_matches_transformers():
    logits = torch.randn(2, 30)
    history = [3, 7, 7, 12]
    ours = _apply_repetition_penalty(logits, rows(*[SamplingParams(repetition_penalty=1.3)] * 2, history=history))
    theirs = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([history] * 2), logits.clone())
    assert torch.allclose(ours, theirs)


def test_filters_keep_exactly_the_allowed_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]] * 3))
    params = [SamplingParams(top_k=2), SamplingParams(top_p=0.8), SamplingParams(min_p=0.25)]
    probs = _filtered_probs(logits, rows(*params))
    assert (probs[0] > 0).tolist() == [True, True, False, False, False]
    assert (probs[1] > 0).tolist() == [True, True, True, False, False]  # 0.5 + 0.2 < 0.8, so 0.15 stays
    assert (probs[2] > 0).tolist() == [True, True, True, False, False]  # >= 0.25 * 0.5


def test_samples_follow_the_distribution_and_never_leave_the_filter():
    logits = torch.log(torch.tensor([[0.6, 0.3, 0.1]]))
    sampler = Sampler(0)
    counts = [0, 0, 0]
    for _ in range(3000):
        counts[sampler(logits, rows(SamplingParams(temperature=1.0)))[0]] += 1
    assert abs(counts[0] / 3000 - 0.6) < 0.04 and abs(counts[2] / 3000 - 0.1) < 0.03
    for _ in range(200):
        assert sampler(logits, rows(SamplingParams(top_k=2)))[0] in (0, 1)


def test_seeded_row_depends_only_on_seed_and_position():
    logits = torch.randn(3, 100)
    seeded = SamplingParams(temperature=1.0, seed=42)
    a = Sampler(1)(logits, rows(SamplingParams(), seeded, SamplingParams()))[1]
    b = Sampler(2)(logits[1:2], rows(seeded))[0]
    assert a == b
    draws = {Sampler(0)(logits[1:2], [SamplingRow(seeded, [1], i)])[0] for i in range(20)}
    assert len(draws) > 1  # a different position draws afresh


def test_per_row_parameters_reach_the_device_through_pinned_copies(monkeypatch):
    """``torch.tensor(values, device="cuda")`` copies from pageable memory, which waits for the forward pass that
    produced the logits. Every per-row tensor must be built on the host and queued through ``to_device``."""
    from engine.step import sampler as sampler_module
    from engine.step.transfer import to_device

    made_on_a_device, moved = [], []
    original_tensor, original_move = torch.tensor, to_device

    def recording_tensor(*args, **kwargs):
        if kwargs.get("device") is not None:
            made_on_a_device.append(kwargs["device"])
        return original_tensor(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", recording_tensor)
    monkeypatch.setattr(sampler_module, "to_device", lambda t, d: moved.append(t.shape) or original_move(t, d),
                        raising=False)
    logits = torch.randn(3, 50)
    every_feature = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.8, top_k=5, repetition_penalty=1.2),
                     SamplingParams(temperature=1.1, top_p=0.9, min_p=0.05, seed=3)]
    got = Sampler(0)(logits, rows(*every_feature))
    assert made_on_a_device == [] and len(got) == 3
    # greedy mask; seen tokens, penalties and row index; temperatures; top-k, top-p and min-p
    assert len(moved) == 8
