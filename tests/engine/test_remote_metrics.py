"""Prometheus text of vLLM, SGLang and llama-server read as KV usage, prefix hit rate and request counts.

The texts are shaped like each server's documented /metrics output (names, labels, HELP/TYPE lines, the
``_total`` suffix or not), so a name typed wrong here or in the parser fails a test."""

import pytest

from engine.remote.metrics import HitRateWindow, parse_prometheus, read_server_metrics

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.37
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="Qwen/Qwen3-8B"} 2500.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="Qwen/Qwen3-8B"} 1300.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 12.0
"""

VLLM_OLD = """# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="meta-llama/Llama-3.1-8B"} 0.25
# TYPE vllm:gpu_prefix_cache_queries counter
vllm:gpu_prefix_cache_queries{model_name="meta-llama/Llama-3.1-8B"} 400
vllm:gpu_prefix_cache_hits{model_name="meta-llama/Llama-3.1-8B"} 100
"""

SGLANG = """# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="meta-llama/Llama-3.1-8B-Instruct"} 8.128902e+06
# HELP sglang:token_usage The token usage
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.28
# HELP sglang:cache_hit_rate The cache hit rate
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.007507552643049313
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
"""

LLAMACPP = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 300
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 100
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 64
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 2
"""

LLAMACPP_OLD = LLAMACPP + """# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.125
"""


def test_vllm_kv_usage_hit_rate_and_requests():
    m = read_server_metrics(VLLM)
    assert m.server_kind == "vLLM" and m.kv_usage == pytest.approx(0.37)
    assert m.prefix_hit_rate == pytest.approx(1300 / 2500) and m.cache_counters == (1300.0, 2500.0)
    assert (m.num_running, m.num_waiting) == (3, 1) and m.reported


def test_vllm_before_v0_10_uses_the_gpu_names():
    m = read_server_metrics(VLLM_OLD)
    assert m.kv_usage == pytest.approx(0.25) and m.prefix_hit_rate == pytest.approx(0.25)


def test_vllm_engines_of_one_server_are_averaged_for_usage_and_summed_for_counters():
    text = VLLM + VLLM.replace('engine="0"', 'engine="1"').replace("0.37", "0.13").replace("1300.0", "700.0")
    m = read_server_metrics(text)
    assert m.kv_usage == pytest.approx(0.25) and m.prefix_hit_rate == pytest.approx(2000 / 5000)
    assert m.num_running == 6


def test_sglang_gauges():
    m = read_server_metrics(SGLANG)
    assert m.server_kind == "SGLang" and m.kv_usage == pytest.approx(0.28)
    assert m.prefix_hit_rate == pytest.approx(0.007507552643049313) and m.num_running == 4 and m.num_waiting == 0


def test_current_llama_server_reports_its_hit_rate_but_no_kv_usage():
    m = read_server_metrics(LLAMACPP)
    assert m.server_kind == "llama.cpp" and m.kv_usage is None
    assert m.prefix_hit_rate == pytest.approx(100 / 400)  # prompt_tokens_total leaves the cached ones out
    assert (m.num_running, m.num_waiting) == (1, 2)


def test_older_llama_server_reports_kv_usage_too():
    assert read_server_metrics(LLAMACPP_OLD).kv_usage == pytest.approx(0.125)


def test_a_server_with_other_metrics_reports_nothing_and_says_so():
    m = read_server_metrics("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 12.5\n")
    assert m.server_kind is None and not m.reported and "no vLLM" in m.note


def test_parser_keeps_labels_with_escapes_and_skips_nan_and_junk():
    samples = parse_prometheus('a{path="x\\"y",b="2"} 1e+06 1700000000\nb NaN\nnot a sample\nc +Inf\n')
    assert samples["a"] == [({"path": 'x"y', "b": "2"}, 1e6)]
    assert "b" not in samples and samples["c"] == [({}, float("inf"))]


def test_hit_rate_window_covers_the_prompts_between_readings():
    window = HitRateWindow(window_s=60)
    first = window.apply(read_server_metrics(LLAMACPP), now=0.0)
    assert not first.hit_rate_recent and first.prefix_hit_rate == pytest.approx(0.25)  # one reading: since start
    later = LLAMACPP.replace("llamacpp:prompt_tokens_total 300", "llamacpp:prompt_tokens_total 320") \
        .replace("llamacpp:prompt_tokens_cached_total 100", "llamacpp:prompt_tokens_cached_total 180")
    second = window.apply(read_server_metrics(later), now=5.0)
    assert second.hit_rate_recent and second.prefix_hit_rate == pytest.approx(80 / 100)


def test_hit_rate_window_restarts_when_the_server_did():
    window = HitRateWindow(window_s=60)
    window.apply(read_server_metrics(VLLM), now=0.0)
    restarted = VLLM.replace("2500.0", "10.0").replace("1300.0", "9.0")
    m = window.apply(read_server_metrics(restarted), now=1.0)
    assert m.prefix_hit_rate == pytest.approx(0.9) and not m.hit_rate_recent


def test_kvasirs_own_exposition_reads_back_through_the_names_they_share():
    """The exporter and the reader take their names from one module: what one writes, the other finds."""
    from engine.api.metrics import prometheus_text
    from tests.helpers.fake_engine import fake_stats

    stats = fake_stats(kv_usage=0.25, num_running=3, num_waiting=2, prompt_tokens_total=400,
                       cached_prompt_tokens_total=100)
    metrics = read_server_metrics(prometheus_text(stats))
    assert metrics.server_kind == "Kvasir" and metrics.reported
    assert (metrics.kv_usage, metrics.num_running, metrics.num_waiting) == (0.25, 3, 2)
    assert metrics.cache_counters == (100.0, 400.0) and metrics.prefix_hit_rate == 0.25
