"""Speed benchmark: Kvasir against its peers on the same model, prompts and machine, in one run.

The peers: llama.cpp (what LM Studio, Ollama and Jan run; engine/tools/peers.py runs its tools when `make peers`
has built them) and transformers' own ``generate`` / ``generate_batch`` on the same model object. ``run_quick`` is
the fast subset (Kvasir vs transformers only); ``run_full`` is ``make bench``. Speed is reported as a ratio
measured side by side, never asserted.
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..config import EngineConfig
from ..devices import cpu_name
from ..sampling_params import SamplingParams
from ..serving.engine import Engine
from . import peers
from .evaluation import chunked_perplexity, eval_text, perplexity
from .plain_attention import plain_attention

SINGLE_ROUNDS = 3
TOPICS = [
    "the history of paper", "how bees make honey", "why the sky is blue", "the rules of chess",
    "how a bicycle stays upright", "the water cycle", "how vaccines work", "the life of a star",
    "what a compiler does", "how bread rises", "the causes of tides", "how birds migrate",
    "what makes music sound happy", "how a lighthouse works", "the invention of the printing press",
    "how volcanoes form",
]


@dataclass(slots=True)
class BenchResult:
    name: str
    requests: int
    output_tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


def chat_prompts(engine: Engine, n: int) -> list[list[int]]:
    return [
        engine.encode_prompt([{"role": "user", "content": f"Write a short essay about {TOPICS[i % len(TOPICS)]}."}])
        for i in range(n)
    ]


def run_engine(engine: Engine, prompts: list[list[int]], new_tokens: int, name: str) -> BenchResult:
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outputs = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    return BenchResult(name, len(prompts), sum(len(o.token_ids) for o in outputs), seconds)


def run_generate_batch(model, prompts: list[list[int]], new_tokens: int) -> BenchResult:
    """transformers' continuous batching over ``prompts``, its paged cache sized for them: left to itself it takes
    60% of the free memory on a CPU (14 GB here), which two runs side by side do not have."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    page = ContinuousBatchingConfig().page_size
    blocks = sum(-(-(len(p) + new_tokens) // page) for p in prompts) + len(prompts)  # one spare a request
    batching = ContinuousBatchingConfig(num_blocks=blocks)
    with plain_attention(model) as reference, torch.inference_mode():
        start = time.perf_counter()
        results = reference.generate_batch(prompts, generation_config=config, continuous_batching_config=batching,
                                       max_new_tokens=new_tokens)
        seconds = time.perf_counter() - start
    tokens = sum(len(r.generated_tokens) for r in results.values())
    return BenchResult("transformers generate_batch", len(prompts), tokens, seconds)


def run_generate(model, prompt: list[int], new_tokens: int) -> BenchResult:
    with plain_attention(model) as reference, torch.inference_mode():
        ids = torch.tensor([prompt], device=reference.device)
        start = time.perf_counter()
        out = reference.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
            do_sample=False, pad_token_id=0,
        )
        seconds = time.perf_counter() - start
    return BenchResult("transformers generate", 1, out.shape[1] - len(prompt), seconds)


def run_quick(config: EngineConfig, concurrent: int = 16, new_tokens: int = 128) -> dict:
    """16 chats x 128 tokens through both continuous batchers, and one chat through both engines."""
    engine = Engine(config)
    model = engine.loaded.model
    prompts = chat_prompts(engine, concurrent)
    run_engine(engine, prompts[:2], 8, "warm-up")
    run_generate(model, prompts[0], 4)
    batch_engine = run_engine(engine, prompts, new_tokens, "kvasir engine")
    batch_peer = run_generate_batch(model, prompts, new_tokens)
    # The single chat is short, so it alternates a few rounds and keeps the median of each (less noise).
    rounds = [
        (run_engine(engine, prompts[:1], new_tokens, "kvasir engine"), run_generate(model, prompts[0], new_tokens))
        for _ in range(SINGLE_ROUNDS)
    ]
    single_engine = _median([r[0] for r in rounds])
    single_peer = _median([r[1] for r in rounds])
    stats = engine.stats()
    return {
        "model": stats.model_name,
        "device": stats.device,
        "dtype": stats.dtype,
        "threads": torch.get_num_threads(),
        "concurrent": [asdict(batch_engine), asdict(batch_peer)],
        "single": [asdict(single_engine), asdict(single_peer)],
        "concurrent_tokens_per_s": [batch_engine.tokens_per_s, batch_peer.tokens_per_s],
        "single_tokens_per_s": [single_engine.tokens_per_s, single_peer.tokens_per_s],
        "concurrent_ratio": batch_engine.tokens_per_s / batch_peer.tokens_per_s,
        "single_ratio": single_engine.tokens_per_s / single_peer.tokens_per_s,
    }


def _median(results: list[BenchResult]) -> BenchResult:
    return sorted(results, key=lambda r: r.tokens_per_s)[len(results) // 2]


def markdown_table(report: dict) -> str:
    """The report as the README's table."""
    c_engine, c_peer = report["concurrent_tokens_per_s"]
    s_engine, s_peer = report["single_tokens_per_s"]
    n = report["concurrent"][0]["requests"]
    tokens = report["concurrent"][0]["output_tokens"] // n
    return "\n".join([
        f"| workload ({report['model']}, {report['device']}, {report['dtype']}) | Kvasir tok/s | "
        f"transformers tok/s | ratio |",
        "|---|---:|---:|---:|",
        f"| {n} chats x {tokens} tokens (vs `generate_batch`) | {c_engine:.1f} | {c_peer:.1f} | "
        f"{report['concurrent_ratio']:.2f}x |",
        f"| 1 chat x {tokens} tokens (vs `generate`, median of {SINGLE_ROUNDS}) | {s_engine:.1f} | "
        f"{s_peer:.1f} | {report['single_ratio']:.2f}x |",
    ])


def print_report(report: dict, as_json: bool) -> None:
    print(markdown_table(report))
    if as_json:
        print(json.dumps(report))


# ---- the full benchmark (`make bench`) ------------------------------------------------------------------------

CHATS = (1, 4, 16, 64)
NEW_TOKENS = 128
PROMPT_TOKENS = 64  # llama-batched-bench's -npp: every chat's prompt is this long on both sides
PP_TOKENS = 512  # the prompt-processing measurement (llama-bench -p 512)
SYSTEM_TOKENS = 1000
CONVERSATIONS, TURNS, REPLY_TOKENS = 8, 4, 32
AGREEMENT_PROMPTS, AGREEMENT_TOKENS = 8, 16  # greedy replies compared with llama.cpp's, token by token
USER_TURNS = ("Let's talk about {topic}.", "Tell me more.", "Why does that matter?", "Sum it up in one sentence.")
FULL_ROUNDS = 1  # rounds per measurement in the full run: with every workload in it, it must stay under 10 minutes
# transformers runs up to this many chats: generate_batch at 64 takes minutes
TRANSFORMERS_MAX_CHATS = 16


@dataclass(slots=True)
class LoadResult:
    """N chats x T tokens on one engine: decode throughput and per-request latencies (None where unknown)."""

    engine: str
    chats: int
    output_tokens: int
    seconds: float
    decode_tokens_per_s: float | None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None
    note: str = ""


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _tokens_of_text(engine: Engine) -> list[int]:

    return engine.tokenizer.encode(eval_text(), add_special_tokens=False)


def sized_prompt(engine: Engine, topic: str, filler: list[str], length: int = PROMPT_TOKENS) -> list[int]:
    """A chat prompt of at most ``length`` tokens (template included): a request plus as much filler as fits."""
    def encode(k: int) -> list[int]:
        content = f"Write a short essay about {topic}. Notes: {' '.join(filler[:k])}"
        return engine.encode_prompt([{"role": "user", "content": content}])

    low, high = 0, min(len(filler), length)
    while low < high:  # the largest filler that still fits
        mid = (low + high + 1) // 2
        low, high = (mid, high) if len(encode(mid)) <= length else (low, mid - 1)
    return encode(low)


def prompt_set(engine: Engine, n: int, salt: int) -> list[list[int]]:
    """``n`` distinct chat prompts of PROMPT_TOKENS; ``salt`` makes each set new, so no run reuses another's cache."""

    words = eval_text().split()
    starts = [(salt * 211 + i * 37) % (len(words) - PROMPT_TOKENS) for i in range(n)]
    return [sized_prompt(engine, TOPICS[i % len(TOPICS)], words[s:s + PROMPT_TOKENS]) for i, s in enumerate(starts)]


def timed_requests(engine: Engine, prompts: list, params: SamplingParams) -> tuple[dict, dict, float]:
    """Run prompts together, stepping by hand to stamp every token: (finals, token times, start) by request id."""
    start = time.perf_counter()
    ids = [engine.add_request(p, params) for p in prompts]
    times: dict[str, list[float]] = {i: [] for i in ids}
    finals = {}
    while engine.has_unfinished():
        outputs = engine.step()
        now = time.perf_counter()
        for out in outputs:
            times[out.request_id].extend([now] * len(out.delta_token_ids))
            if out.finished:
                finals[out.request_id] = out
    return finals, times, start


def kvasir_load(engine: Engine, prompts: list[list[int]], new_tokens: int) -> LoadResult:
    """N chats x T tokens through Kvasir: decode tok/s over the decode phase, TTFT and inter-token latencies."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    finals, times, start = timed_requests(engine, prompts, params)
    stamps = [t for t in times.values() if t]
    decode_from = max(t[0] for t in stamps)  # every chat has its first token: the rest is decoding
    decoded = sum(1 for t in stamps for s in t if s > decode_from)
    end = max(t[-1] for t in stamps)
    gaps = [b - a for t in stamps for a, b in zip(t, t[1:])]
    ttfts = [o.metrics.ttft_s for o in finals.values() if o.metrics.ttft_s is not None]
    rate = decoded / (end - decode_from) if end > decode_from else None
    return LoadResult("kvasir", len(prompts), sum(len(t) for t in stamps), end - start, rate,
                      percentile(ttfts, 50), percentile(ttfts, 95), percentile(gaps, 50), percentile(gaps, 95))


def kvasir_loads(engine: Engine, chats, new_tokens: int, progress) -> list[LoadResult]:
    """Each number of chats on fresh prompts; one chat is short and noisy, so it keeps the median of FULL_ROUNDS."""
    results = []
    for n in chats:
        progress(f"kvasir: {n} chats x {new_tokens} tokens")
        rounds = FULL_ROUNDS if n == 1 else 1
        runs = [kvasir_load(engine, prompt_set(engine, n, salt=100 * n + r), new_tokens) for r in range(rounds)]
        results.append(sorted(runs, key=lambda r: r.decode_tokens_per_s or 0.0)[len(runs) // 2])
    return results


def kvasir_prompt_speed(engine: Engine, text_ids: list[int]) -> dict:
    """Prompt processing tok/s: a PP_TOKENS raw prompt (different each round, so never cached) to its first token."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    rates = []
    for r in range(FULL_ROUNDS):
        offset = (r * PP_TOKENS) % max(1, len(text_ids) - PP_TOKENS)
        out = engine.generate([text_ids[offset:offset + PP_TOKENS]], params)[0]
        rates.append(out.metrics.prompt_tokens / out.metrics.ttft_s)
    return {"prompt_tokens": PP_TOKENS, "prompt_tokens_per_s": statistics.median(rates)}


def system_prompt_messages(engine: Engine, text_ids: list[int], offset: int, question: str) -> list[int]:
    """A chat with a SYSTEM_TOKENS system prompt (cut from the shipped text at ``offset``) and one question."""
    system = engine.tokenizer.decode(text_ids[offset:offset + SYSTEM_TOKENS])
    return engine.encode_prompt([{"role": "system", "content": system}, {"role": "user", "content": question}])


def shared_system_prompts(engine: Engine, text_ids: list[int]) -> list[tuple[list[int], list[int]]]:
    """Pairs of prompts with the same long system prompt and different questions; each pair a new system prompt."""
    offsets = [(r * 311) % max(1, len(text_ids) - SYSTEM_TOKENS) for r in range(FULL_ROUNDS)]
    return [(system_prompt_messages(engine, text_ids, o, "What is this text about?"),
             system_prompt_messages(engine, text_ids, o, "Who wrote it?")) for o in offsets]


def kvasir_system_prompt(engine: Engine, pairs) -> dict:
    """TTFT of the first question on a new system prompt (cold) and of the next one (served from the prefix cache)."""
    params = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    cold, cached, hits = [], [], []
    for first, second in pairs:
        a, b = engine.generate([first], params)[0], engine.generate([second], params)[0]
        cold.append(a.metrics.ttft_s)
        cached.append(b.metrics.ttft_s)
        hits.append(b.metrics.cached_prompt_tokens / b.metrics.prompt_tokens)
    return {"prompt_tokens": len(pairs[0][0]), "cold_ttft_s": statistics.median(cold),
            "cached_ttft_s": statistics.median(cached), "cached_share": statistics.median(hits)}


def kvasir_conversations(engine: Engine) -> tuple[dict, list[list[list[int]]]]:
    """CONVERSATIONS chats x TURNS turns, each turn of all chats together; the share of prompt tokens served from
    the prefix cache, and the prompts of every turn (so a peer can be sent the very same ones)."""
    params = SamplingParams(max_tokens=REPLY_TOKENS, temperature=0.0)
    histories = [[] for _ in range(CONVERSATIONS)]
    turns, prompt_tokens, cached_tokens = [], [0] * TURNS, [0] * TURNS
    for t in range(TURNS):
        for c, history in enumerate(histories):
            history.append({"role": "user", "content": USER_TURNS[t].format(topic=TOPICS[c % len(TOPICS)])})
        prompts = [engine.encode_prompt(h) for h in histories]
        turns.append(prompts)
        for history, out in zip(histories, engine.generate(prompts, params)):
            history.append({"role": "assistant", "content": out.text})
            prompt_tokens[t] += out.metrics.prompt_tokens
            cached_tokens[t] += out.metrics.cached_prompt_tokens
    return cache_shares(prompt_tokens, cached_tokens), turns


def cache_shares(prompt_tokens: list[int], cached_tokens: list[int]) -> dict:
    """Share of prompt tokens served from cache, over all turns and over the turns after the first."""
    later = sum(prompt_tokens[1:])
    return {"conversations": CONVERSATIONS, "turns": TURNS, "prompt_tokens": sum(prompt_tokens),
            "cached_tokens": sum(cached_tokens), "cached_share": sum(cached_tokens) / max(1, sum(prompt_tokens)),
            "cached_share_later_turns": sum(cached_tokens[1:]) / max(1, later)}


def peak_rss_bytes() -> int:
    """This process's peak resident memory (Linux and macOS report ru_maxrss in different units)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if platform.system() == "Darwin" else peak * 1024


def measure_kvasir(engine: Engine, chats, new_tokens: int, progress) -> tuple[dict, list]:
    """Every Kvasir figure; also the shared inputs the peers are given (system-prompt pairs, conversation turns)."""

    text_ids = _tokens_of_text(engine)
    loads = kvasir_loads(engine, chats, new_tokens, progress)
    progress("kvasir: prompt processing, system prompt, conversations, perplexity")
    pairs = shared_system_prompts(engine, text_ids)
    result = {"loads": [asdict(r) for r in loads], "prompt": kvasir_prompt_speed(engine, text_ids),
              "system_prompt": kvasir_system_prompt(engine, pairs)}
    result["conversations"], turns = kvasir_conversations(engine)
    result["perplexity"] = {"perplexity": perplexity(engine, eval_text()), "context": 512}
    result["perplexity_chunks"] = {"perplexity": chunked_perplexity(engine, eval_text()), "context": 512}
    result["max_rss_bytes"] = peak_rss_bytes()
    return result, [pairs, turns, greedy_replies(engine)]


def greedy_replies(engine: Engine) -> list[tuple[list[int], list[int]]]:
    """(prompt, Kvasir's greedy reply) for AGREEMENT_PROMPTS chat prompts, AGREEMENT_TOKENS tokens each."""
    prompts = chat_prompts(engine, AGREEMENT_PROMPTS)
    params = SamplingParams(max_tokens=AGREEMENT_TOKENS, temperature=0.0, ignore_eos=True)
    return [(p, out.token_ids) for p, out in zip(prompts, engine.generate(prompts, params))]


def greedy_agreement(server: peers.LlamaServer, replies) -> dict:
    """How many of Kvasir's greedy replies llama-server repeats token for token, and their mean common prefix."""
    common = []
    for prompt, mine in replies:
        theirs = server.complete(prompt, len(mine))["tokens"]
        same = next((i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        common.append(same)
    return {"prompts": len(replies), "tokens": AGREEMENT_TOKENS,
            "identical": f"{sum(c == AGREEMENT_TOKENS for c in common)} of {len(replies)}",
            "mean_common_prefix": statistics.mean(common) if common else None}


def measure_transformers(model, engine: Engine, chats, new_tokens: int, progress) -> dict:
    """transformers on the same model object: ``generate`` for one chat, ``generate_batch`` for more."""
    loads = []
    for n in [n for n in chats if n <= TRANSFORMERS_MAX_CHATS]:
        progress(f"transformers: {n} chats x {new_tokens} tokens")
        prompts = prompt_set(engine, n, salt=100 * n)
        if n == 1:
            result = _median([run_generate(model, prompts[0], new_tokens) for _ in range(FULL_ROUNDS)])
        else:
            result = run_generate_batch(model, prompts, new_tokens)
        loads.append(asdict(LoadResult(result.name, n, result.output_tokens, result.seconds, result.tokens_per_s,
                                       note="end to end (prompt included); no per-token timing")))
    text_ids = _tokens_of_text(engine)[:PP_TOKENS]
    single = run_generate(model, text_ids, 1)
    return {"loads": loads, "prompt": {"prompt_tokens": PP_TOKENS, "prompt_tokens_per_s": PP_TOKENS / single.seconds},
            "max_rss_bytes": peak_rss_bytes(),
            "note": "runs in Kvasir's process on Kvasir's model object: its memory is that process's peak; "
                    f"up to {TRANSFORMERS_MAX_CHATS} chats, to keep the run under 10 minutes"}


def gguf_of(config: EngineConfig) -> Path | None:
    """The GGUF file behind a model setting, which llama.cpp can run too; None for other formats."""
    if config.model == "default":
        from ..models.sources import default_model_path

        return default_model_path()
    path = Path(config.model)
    return path if path.suffix == ".gguf" and path.is_file() else None


def llama_loads(batched: dict) -> list[dict]:
    """llama-batched-bench's rows as load results. All prompts go in one batch, so every chat has its first token
    when that batch is done (TTFT = T_PP); all chats then advance together, one step per token (ITL = T_TG / TG)."""
    note = "TTFT = time to process all prompts; ITL = mean step time (derived from llama-batched-bench)"
    return [asdict(LoadResult("llama.cpp", r["pl"], r["pl"] * r["tg"], r["t"], r["speed_tg"], r["t_pp"], r["t_pp"],
                              r["t_tg"] / r["tg"], r["t_tg"] / r["tg"], note)) for r in batched["rows"]]


def llama_system_prompt(server: peers.LlamaServer, pairs) -> dict:
    """The same system-prompt pairs through llama-server, whose slots keep the last prompt's KV cache."""
    cold, cached, hits = [], [], []
    for first, second in pairs:
        a, b = server.complete(first, 1), server.complete(second, 1)
        cold.append(a["seconds"])
        cached.append(b["seconds"])
        hits.append((b["cache_n"] or 0) / max(1, (b["cache_n"] or 0) + (b["prompt_n"] or 0)))
    return {"prompt_tokens": len(pairs[0][0]), "cold_ttft_s": statistics.median(cold),
            "cached_ttft_s": statistics.median(cached), "cached_share": statistics.median(hits),
            "note": "TTFT = wall time of a 1-token completion over HTTP"}


def llama_conversations(server: peers.LlamaServer, turns: list[list[list[int]]]) -> dict:
    """Kvasir's conversation turns sent to llama-server one request at a time, conversation after conversation."""
    prompt_tokens, cached_tokens = [0] * len(turns), [0] * len(turns)
    for t, prompts in enumerate(turns):
        for prompt in prompts:
            reply = server.complete(prompt, REPLY_TOKENS, ignore_eos=False)
            cached_tokens[t] += reply["cache_n"] or 0
            prompt_tokens[t] += (reply["cache_n"] or 0) + (reply["prompt_n"] or 0)
    return cache_shares(prompt_tokens, cached_tokens) | {"note": "requests sent one at a time, default slots"}


def llama_server_part(model: Path, shared: list, threads: int) -> dict:
    """Prompt caching in llama-server: the shared system prompt and the multi-turn conversations."""
    if peers.find_tool("llama-server") is None:
        return {part: peers.skipped("llama-server") for part in ("system_prompt", "conversations", "greedy_agreement")}
    pairs, turns, replies = shared
    try:
        with peers.server(model, threads=threads) as server:
            part = {"system_prompt": llama_system_prompt(server, pairs),
                    "conversations": llama_conversations(server, turns),
                    "greedy_agreement": greedy_agreement(server, replies)}
            part["server_max_rss_bytes"] = server.max_rss_bytes()
    except (OSError, RuntimeError) as exc:  # a server that will not start or answer is a note, not a crash
        note = {"skipped": f"llama-server: {exc}"}
        return {"system_prompt": note, "conversations": note, "greedy_agreement": note}
    return part


def measure_llama(model: Path | None, chats, new_tokens: int, shared: list, threads: int, progress) -> dict:
    """Every llama.cpp figure on the same GGUF; a tool that is not built leaves a note in place of its numbers."""
    from importlib import resources

    if model is None:
        return {"skipped": "llama.cpp runs GGUF files only; this model is not one"}
    progress("llama.cpp: llama-bench, llama-batched-bench, llama-perplexity, llama-server")
    bench = peers.llama_bench(model, threads, prompt=PP_TOKENS, gen=new_tokens)
    batched = peers.batched_bench(model, tuple(chats), PROMPT_TOKENS, new_tokens, threads)
    with resources.as_file(resources.files("engine").joinpath("data/eval_text.txt")) as text_file:
        ppl = peers.perplexity(model, text_file, 512, threads)
    result = {"build": peers.build_info(), "bench": bench, "batched": batched, "perplexity_chunks": ppl,
              "loads": batched if "skipped" in batched else llama_loads(batched),
              "prompt": bench if "skipped" in bench else {
                  "prompt_tokens": PP_TOKENS, "prompt_tokens_per_s": bench["prompt_tokens_per_s"]}}
    result |= llama_server_part(model, shared, threads)
    rss = [p.get("max_rss_bytes") for p in (bench, batched, ppl)] + [result.pop("server_max_rss_bytes", None)]
    result["max_rss_bytes"] = max((r for r in rss if r), default=None)
    return result


def machine_info() -> dict:
    """The machine line of a report: CPU, cores, memory, OS and library versions."""
    import psutil
    import transformers

    cpu = cpu_name()
    ram = psutil.virtual_memory().total
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_bytes": ram, "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "torch_threads": torch.get_num_threads(), "gpu": torch.cuda.get_device_name() if torch.cuda.is_available()
            else None}


def warm_up(engine: Engine) -> None:
    """One short run on each side, so the first measured run pays for no lazy initialisation."""
    run_engine(engine, chat_prompts(engine, 2), 8, "warm-up")
    run_generate(engine.loaded.model, chat_prompts(engine, 1)[0], 4)


def run_full(config: EngineConfig, chats=CHATS, new_tokens: int = NEW_TOKENS, with_peers: bool = True,
             progress=print) -> dict:
    """The whole comparison, `make bench`: Kvasir, llama.cpp and transformers on one model in one run."""
    started = time.perf_counter()
    progress("loading the model")
    engine = Engine(config)
    warm_up(engine)
    kvasir, shared = measure_kvasir(engine, chats, new_tokens, progress)
    transformers = measure_transformers(engine.loaded.model, engine, chats, new_tokens, progress)
    threads = torch.get_num_threads()
    llama = measure_llama(gguf_of(config), chats, new_tokens, shared, threads, progress) if with_peers else {
        "skipped": "not run (--no-peers)"}
    stats = engine.stats()
    engines = {"kvasir": kvasir, "llama.cpp": llama, "transformers": transformers}
    return {"kind": "full", "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": machine_info(),
            "model": {"name": stats.model_name, "file": getattr(gguf_of(config), "name", config.model),
                      "device": stats.device, "dtype": stats.dtype, "quantization": stats.quantization},
            "settings": {"chats": list(chats), "new_tokens": new_tokens, "prompt_tokens": PROMPT_TOKENS,
                         "threads": threads, "system_tokens": SYSTEM_TOKENS, "pp_tokens": PP_TOKENS},
            "engines": engines, "ratios": ratios(engines), "bench_seconds": time.perf_counter() - started}


def _ratio(a, b) -> float | None:
    return a / b if a and b else None


def ratios(engines: dict) -> dict:
    """Kvasir / each peer: decode tok/s per number of chats and prompt tok/s (above 1: Kvasir is faster), memory
    (above 1: Kvasir uses more)."""
    kvasir = engines["kvasir"]
    mine = {r["chats"]: r["decode_tokens_per_s"] for r in kvasir["loads"]}
    result = {}
    for name in ("llama.cpp", "transformers"):
        peer = engines[name]
        loads = peer.get("loads") if isinstance(peer.get("loads"), list) else []
        result[name] = {
            "decode_tokens_per_s": {str(r["chats"]): _ratio(mine.get(r["chats"]), r["decode_tokens_per_s"])
                                    for r in loads},
            "prompt_tokens_per_s": _ratio(kvasir["prompt"]["prompt_tokens_per_s"],
                                          peer.get("prompt", {}).get("prompt_tokens_per_s")),
            "max_rss": _ratio(kvasir["max_rss_bytes"], peer.get("max_rss_bytes")),
        }
    return result


def report_json(report: dict) -> str:
    """The report as indented JSON."""
    return json.dumps(report, indent=2, default=str)
