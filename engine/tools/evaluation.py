"""How much each quantisation mode costs in quality, memory and speed, measured on the same text."""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from importlib import resources

import torch

from ..config import WEIGHT_MODES, EngineConfig
from ..sampling_params import SamplingParams
from ..serving.engine import Engine
from .plain_attention import plain_attention

MODES = WEIGHT_MODES
WINDOW, STRIDE = 512, 256
DECODE_TOKENS = 64


@dataclass(frozen=True, slots=True)
class QuantResult:
    mode: str
    dtype: str
    perplexity: float
    weight_bytes: int
    peak_load_bytes: int
    decode_tokens_per_s: float


def eval_text() -> str:
    """The fixed public-domain text shipped with the engine."""
    return resources.files("engine").joinpath("data/eval_text.txt").read_text()


@torch.inference_mode()
def perplexity(engine: Engine, text: str, window: int = WINDOW, stride: int = STRIDE) -> float:
    """Sliding-window perplexity of ``text``: each token is scored once, with up to ``window`` of context."""
    ids = torch.tensor([engine.tokenizer.encode(text, add_special_tokens=False)], device=engine.device)
    model = engine.loaded.model
    total_nll, counted, previous_end = 0.0, 0, 0
    with plain_attention(model) as reference:
        for start in range(0, ids.shape[1], stride):
            end = min(start + window, ids.shape[1])
            chunk = ids[:, start:end]
            logits = reference(chunk).logits.float()[0, :-1]
            targets = chunk[0, 1:]
            fresh = end - max(previous_end, start + 1)  # tokens not scored by an earlier window
            nll = torch.nn.functional.cross_entropy(logits[-fresh:], targets[-fresh:], reduction="sum")
            total_nll, counted, previous_end = total_nll + nll.item(), counted + fresh, end
            if end == ids.shape[1]:
                break
    return math.exp(total_nll / counted)


@torch.inference_mode()
def chunked_perplexity(engine: Engine, text: str, context: int = WINDOW) -> float:
    """Perplexity scored as llama.cpp's ``llama-perplexity`` scores it, so the two compare directly.

    The text (with the model's BOS where it adds one) is cut into whole chunks of ``context`` tokens, each
    evaluated on its own; only the second half of each chunk is scored, so every scored token has at least
    half a chunk of context.
    """
    ids = engine.tokenizer.encode(text, add_special_tokens=True)
    bos = engine.tokenizer.bos_token_id if ids and ids[0] == engine.tokenizer.bos_token_id else None
    chunks = len(ids) // context
    if chunks == 0:
        raise ValueError(f"the text has {len(ids)} tokens, fewer than one chunk of {context}")
    model, first = engine.loaded.model, context // 2
    total_nll, counted = 0.0, 0
    with plain_attention(model) as reference:
        for c in range(chunks):
            chunk = ids[c * context:(c + 1) * context]
            if bos is not None:
                chunk = [bos, *chunk[1:]]  # as llama-perplexity does: every chunk starts at BOS
            logits = reference(torch.tensor([chunk], device=engine.device)).logits.float()[0]
            targets = torch.tensor(chunk[first + 1:], device=engine.device)
            nll = torch.nn.functional.cross_entropy(logits[first:-1], targets, reduction="sum")
            total_nll, counted = total_nll + nll.item(), counted + len(targets)
    return math.exp(total_nll / counted)


def decode_speed(engine: Engine) -> float:
    params = SamplingParams(max_tokens=DECODE_TOKENS, temperature=0.0, ignore_eos=True)
    out = engine.generate([[{"role": "user", "content": "Tell me about the history of paper."}]], params)[0]
    return out.metrics.decode_tokens_per_s or 0.0


def evaluate(model: str = "default", device: str = "auto", modes=MODES, progress=print) -> list[QuantResult]:
    """Load ``model`` in each mode in turn (switching one engine) and measure it."""
    results, engine, text = [], None, eval_text()
    for mode in modes:
        config = EngineConfig(model=model, quantization=mode, device=device, num_kv_blocks=256)
        started = time.perf_counter()
        if engine is None:
            engine = Engine(config)
        else:
            engine.switch_model(config)
        progress(f"{mode}: loaded in {time.perf_counter() - started:.1f} s, measuring")
        stats = engine.stats()
        results.append(QuantResult(mode, stats.dtype, perplexity(engine, text), stats.model_memory_bytes,
                                   stats.peak_load_bytes, decode_speed(engine)))
    return results


def markdown_table(results: list[QuantResult], model_name: str, device: str) -> str:
    mib = 1024**2
    lines = [
        f"| {model_name} on {device} | compute dtype | perplexity | weight memory | decode tok/s |",
        "|---|---|---:|---:|---:|",
    ]
    for r in results:
        lines.append(f"| `{r.mode}` | {r.dtype} | {r.perplexity:.2f} | {r.weight_bytes / mib:.0f} MiB | "
                     f"{r.decode_tokens_per_s:.1f} |")
    return "\n".join(lines)


def to_json(results: list[QuantResult]) -> str:
    return json.dumps([asdict(r) for r in results])
