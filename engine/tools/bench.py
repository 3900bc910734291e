"""Throughput benchmark: the engine against transformers on the same model, prompts and machine, in one run."""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict, dataclass

import torch

from ..config import EngineConfig
from ..sampling import SamplingParams
from ..serving.engine import Engine

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


@contextlib.contextmanager
def plain_attention(model):
    """Let transformers' own generation run on the engine's module (same weights) with sdpa attention."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)


def run_generate_batch(model, prompts: list[list[int]], new_tokens: int) -> BenchResult:
    from transformers import GenerationConfig

    config = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    with plain_attention(model), torch.inference_mode():
        start = time.perf_counter()
        results = model.generate_batch(prompts, generation_config=config, max_new_tokens=new_tokens)
        seconds = time.perf_counter() - start
    tokens = sum(len(r.generated_tokens) for r in results.values())
    return BenchResult("transformers generate_batch", len(prompts), tokens, seconds)


def run_generate(model, prompt: list[int], new_tokens: int) -> BenchResult:
    with plain_attention(model), torch.inference_mode():
        ids = torch.tensor([prompt], device=model.device)
        start = time.perf_counter()
        out = model.generate(
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
