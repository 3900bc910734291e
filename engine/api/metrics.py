"""``GET /metrics``: the engine's numbers in Prometheus' text format, named as vLLM names its own (with the
prefix ``kvasir:``), so dashboards and remote panels that read a vLLM server read a Kvasir one the same way."""

from __future__ import annotations

from ..serving.metrics import EngineStats

# (name, type, help, value of the stats)
METRICS = (
    ("kv_cache_usage_perc", "gauge", "KV-cache usage (1 = every block in use by a live request)",
     lambda s: s.kv_usage),
    ("num_requests_running", "gauge", "Requests in the running batch", lambda s: s.num_running),
    ("num_requests_waiting", "gauge", "Requests waiting to be scheduled", lambda s: s.num_waiting),
    ("prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache",
     lambda s: s.prompt_tokens_total),
    ("prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache",
     lambda s: s.cached_prompt_tokens_total),
    ("prefix_cache_hit_rate", "gauge", "Share of prompt tokens served from the prefix cache, recent requests",
     lambda s: s.prefix_hit_rate),
    ("prompt_tokens_total", "counter", "Prompt tokens admitted", lambda s: s.prompt_tokens_total),
    ("generation_tokens_total", "counter", "Tokens generated", lambda s: s.generated_tokens_total),
    ("num_preemptions_total", "counter", "Requests preempted (recomputed later)", lambda s: s.num_preempted_total),
    ("kv_blocks_total", "gauge", "Blocks in the KV pool", lambda s: s.kv_blocks_total),
    ("kv_blocks_used", "gauge", "Blocks held by live requests", lambda s: s.kv_blocks_used),
    ("kv_blocks_cached", "gauge", "Unreferenced blocks keeping a reusable prefix", lambda s: s.kv_blocks_cached),
    ("kv_blocks_free", "gauge", "Free blocks", lambda s: s.kv_blocks_free),
)


def prometheus_text(stats: EngineStats) -> str:
    """The exposition text of ``stats``, each sample labelled with the model name."""
    label = stats.model_name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    lines = []
    for name, kind, help_text, value in METRICS:
        lines += [f"# HELP kvasir:{name} {help_text}", f"# TYPE kvasir:{name} {kind}",
                  f'kvasir:{name}{{model_name="{label}"}} {float(value(stats))!r}']
    return "\n".join(lines) + "\n"
