"""The names under which ``GET /metrics`` exports Kvasir's numbers: vLLM's own names with the prefix ``kvasir:``.
The exporter (:mod:`engine.api.metrics`) writes them and the remote reader (:mod:`engine.remote.metrics`) looks
for them, so the two can't drift apart. Counters are named without ``_total``; the exposition adds it."""

PREFIX = "kvasir:"

KV_CACHE_USAGE = PREFIX + "kv_cache_usage_perc"
REQUESTS_RUNNING = PREFIX + "num_requests_running"
REQUESTS_WAITING = PREFIX + "num_requests_waiting"
PREFIX_CACHE_QUERIES = PREFIX + "prefix_cache_queries"  # counter
PREFIX_CACHE_HITS = PREFIX + "prefix_cache_hits"  # counter
PREFIX_CACHE_HIT_RATE = PREFIX + "prefix_cache_hit_rate"
PROMPT_TOKENS = PREFIX + "prompt_tokens"  # counter
GENERATION_TOKENS = PREFIX + "generation_tokens"  # counter
PREEMPTIONS = PREFIX + "num_preemptions"  # counter
KV_BLOCKS_TOTAL = PREFIX + "kv_blocks_total"
KV_BLOCKS_USED = PREFIX + "kv_blocks_used"
KV_BLOCKS_CACHED = PREFIX + "kv_blocks_cached"
KV_BLOCKS_FREE = PREFIX + "kv_blocks_free"
SPEC_DECODE_DRAFTS = PREFIX + "spec_decode_num_drafts"  # counter
SPEC_DECODE_DRAFT_TOKENS = PREFIX + "spec_decode_num_draft_tokens"  # counter
SPEC_DECODE_ACCEPTED_TOKENS = PREFIX + "spec_decode_num_accepted_tokens"  # counter
