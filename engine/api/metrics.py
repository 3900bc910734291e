"""``GET /metrics``: the engine's numbers in Prometheus' text format, named as vLLM names its own (with the
prefix ``kvasir:``, :mod:`engine.serving.prometheus_names`), so dashboards and remote panels that read a vLLM
server read a Kvasir one the same way."""

from __future__ import annotations

from ..serving import prometheus_names as names
from ..serving.metrics import EngineStats

# (name, type, help, value of the stats); a counter's exposed name ends in _total
METRICS = (
    (names.KV_CACHE_USAGE, "gauge", "KV-cache usage (1 = every block in use by a live request)",
     lambda s: s.kv_usage),
    (names.REQUESTS_RUNNING, "gauge", "Requests in the running batch", lambda s: s.num_running),
    (names.REQUESTS_WAITING, "gauge", "Requests waiting to be scheduled", lambda s: s.num_waiting),
    (names.PREFIX_CACHE_QUERIES, "counter", "Prompt tokens looked up in the prefix cache",
     lambda s: s.prompt_tokens_total),
    (names.PREFIX_CACHE_HITS, "counter", "Prompt tokens served from the prefix cache",
     lambda s: s.cached_prompt_tokens_total),
    (names.PREFIX_CACHE_HIT_RATE, "gauge", "Share of prompt tokens served from the prefix cache, recent requests",
     lambda s: s.prefix_hit_rate),
    (names.PROMPT_TOKENS, "counter", "Prompt tokens admitted", lambda s: s.prompt_tokens_total),
    (names.GENERATION_TOKENS, "counter", "Tokens generated", lambda s: s.generated_tokens_total),
    (names.PREEMPTIONS, "counter", "Requests preempted (recomputed later)", lambda s: s.num_preempted_total),
    (names.KV_BLOCKS_TOTAL, "gauge", "Blocks in the KV pool", lambda s: s.kv_blocks_total),
    (names.KV_BLOCKS_USED, "gauge", "Blocks held by live requests", lambda s: s.kv_blocks_used),
    (names.KV_BLOCKS_CACHED, "gauge", "Unreferenced blocks keeping a reusable prefix", lambda s: s.kv_blocks_cached),
    (names.KV_BLOCKS_FREE, "gauge", "Free blocks", lambda s: s.kv_blocks_free),
    (names.SPEC_DECODE_DRAFTS, "counter", "Speculative drafts computed",
     lambda s: s.speculation.num_drafts_total if s.speculation else 0),
    (names.SPEC_DECODE_DRAFT_TOKENS, "counter", "Draft tokens computed",
     lambda s: s.speculation.draft_tokens_total if s.speculation else 0),
    (names.SPEC_DECODE_ACCEPTED_TOKENS, "counter", "Draft tokens kept",
     lambda s: s.speculation.accepted_draft_tokens_total if s.speculation else 0),
)


def exposed_name(name: str, kind: str) -> str:
    """The name a sample goes out under: a counter's ends in ``_total``, as Prometheus names them."""
    return f"{name}_total" if kind == "counter" else name


def prometheus_text(stats: EngineStats | dict[str, EngineStats]) -> str:
    """The exposition text of one model's ``stats`` (labelled with its name), or of several resident models'
    (id -> stats, each sample labelled with the model's id)."""
    models = stats if isinstance(stats, dict) else {stats.model_name: stats}
    lines = []
    for name, kind, help_text, value in METRICS:
        exposed = exposed_name(name, kind)
        lines += [f"# HELP {exposed} {help_text}", f"# TYPE {exposed} {kind}"]
        lines += [f'{exposed}{{model_name="{_label(model)}"}} {float(value(one))!r}' for model, one in models.items()]
    return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
