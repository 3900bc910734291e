"""The panel's history (no Qt): what each snapshot adds, each request's first token once, the time span and the
value axes' tops."""

import pytest

from app.panel.history import HISTORY_S, EngineHistory, nice_ceiling
from engine import FirstToken
from tests.helpers.fake_engine import fake_stats


def token(number, ttft, queue=0.001):
    return FirstToken(number, ttft, queue)


def test_each_snapshot_adds_one_point_per_rate_series():
    history = EngineHistory()
    history.add(fake_stats(decode_tokens_per_s=20.0, prefill_tokens_per_s=500.0, kv_usage=0.25), now=10.0)
    history.add(fake_stats(decode_tokens_per_s=30.5, prefill_tokens_per_s=0.0, kv_usage=0.5), now=10.25)
    assert list(history.points["decode"]) == [(10.0, 20.0), (10.25, 30.5)]
    assert list(history.points["prefill"]) == [(10.0, 500.0), (10.25, 0.0)]
    assert list(history.points["kv_usage"]) == [(10.0, 25.0), (10.25, 50.0)]  # in per cent
    assert history.latest == 10.25


def test_each_first_token_is_recorded_once_though_snapshots_repeat_it():
    history = EngineHistory()
    assert history.add(fake_stats(first_tokens=(token(1, 0.05, 0.002),)), now=1.0) == 1
    assert history.add(fake_stats(first_tokens=(token(1, 0.05, 0.002),)), now=1.25) == 0
    assert history.add(fake_stats(first_tokens=(token(1, 0.05), token(2, 0.3), token(3, 0.12))), now=1.5) == 2
    assert list(history.points["ttft"]) == [(1.0, 50.0), (1.5, 300.0), (1.5, 120.0)]  # ms
    assert history.values("queue") == [2.0, 1.0, 1.0]


def test_a_restarted_engine_counting_from_one_again_is_still_recorded():
    history = EngineHistory()
    history.add(fake_stats(first_tokens=tuple(token(n, 0.1) for n in range(1, 41))), now=1.0)
    assert history.add(fake_stats(first_tokens=(token(1, 0.7), token(2, 0.8))), now=2.0) == 2
    assert history.values("ttft")[-2:] == [700.0, 800.0]


def test_points_older_than_the_span_are_dropped():
    history = EngineHistory()
    history.add(fake_stats(decode_tokens_per_s=1.0, first_tokens=(token(1, 0.1),)), now=0.0)
    history.add(fake_stats(decode_tokens_per_s=2.0), now=HISTORY_S)
    history.add(fake_stats(decode_tokens_per_s=3.0), now=HISTORY_S + 1)
    assert history.values("decode") == [2.0, 3.0] and history.values("ttft") == []


@pytest.mark.parametrize(("recorded", "span"), [(0, 60), (5, 60), (60, 60), (61, 120), (150, 180), (299, 300),
                                                (1000, 300)])
def test_the_time_span_grows_by_whole_minutes_from_one_to_five(recorded, span):
    history = EngineHistory(span_s=HISTORY_S)
    history.add(fake_stats(), now=1000.0 - min(recorded, HISTORY_S))
    history.add(fake_stats(), now=1000.0)
    assert history.span() == span


@pytest.mark.parametrize(("value", "ceiling"), [(0, 0), (0.3, 0.5), (1, 1), (1.01, 2), (23.5, 25), (26, 50),
                                                (51, 100), (850, 1000), (1001, 2000), (2400, 2500), (12_000, 20_000)])
def test_nice_ceiling(value, ceiling):
    assert nice_ceiling(value) == pytest.approx(ceiling)


def test_axis_tops_follow_the_data_within_floor_and_cap():
    history = EngineHistory()
    history.add(fake_stats(decode_tokens_per_s=3.0, kv_usage=0.02), now=0.0)
    assert history.ceiling(["decode"], floor=10.0) == 10.0  # a quiet engine is not drawn as noise
    history.add(fake_stats(decode_tokens_per_s=142.7, kv_usage=0.97), now=1.0)
    assert history.ceiling(["decode"], floor=10.0) == 200.0
    assert history.ceiling(["kv_usage"], floor=10.0, cap=100.0) == 100.0
    history.add(fake_stats(first_tokens=(token(1, 0.26, 0.9),)), now=2.0)
    assert history.ceiling(["ttft", "queue"], floor=100.0) == 1000.0  # the largest of both series
