"""What each KV cache format costs on a model, against a float32 cache: ``eval-quant --kv``'s rows.

Quality: the shipped text is scored through the paged cache itself, in windows of :data:`WINDOW` tokens written
:data:`CHUNK` at a time, so every token attends to keys and values read back from the cache in the format under
test; each position's next-token distribution is compared with the float32 cache's (KL divergence, top-1
agreement) and the text's perplexity is reported. Speed: decode tokens/s at one and sixteen chats of
:data:`PROMPT_TOKENS`-token prompts, every format measured in each of :data:`ROUNDS` interleaved rounds (best
kept), so a drift of the machine's speed reaches every format alike.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch

from ..config import EngineConfig
from ..models import kv_verdicts
from ..models.kv_verdicts import THRESHOLDS, KVRow
from ..serving.engine import Engine
from ..serving.kv_cache import KVCache, KVShape
from ..serving.kv_format import FORMATS, KVFormat
from ..step.attention import SequenceSlice, build_metadata
from .bench import TOPICS, kvasir_load, sized_prompt
from .evaluation import eval_text

WINDOW = 512  # tokens of context at most, as eval-quant's perplexity
CHUNK = 128  # tokens a step writes before the next step reads them back
PROMPT_TOKENS = 512
NEW_TOKENS = 64
CHATS = (1, 16)
ROUNDS = 2


def formats_for(engine: Engine) -> tuple[str, ...]:
    """The formats the loaded model can use on its device, float32 first (the reference); fp8 on CUDA only."""
    names = ("float32", "bfloat16", "float16", "q8_0", "fp8")
    return tuple(n for n in names if FORMATS[n].problem(engine.kv_cache.shape.head_dim, engine.device) is None)


@dataclasses.dataclass(slots=True)
class _Quality:
    nll: float = 0.0
    kl: float = 0.0
    agreed: int = 0
    positions: int = 0


@torch.inference_mode()
def window_logits(engine: Engine, fmt: KVFormat, ids: list[int]) -> torch.Tensor:
    """``[len(ids), vocab]`` next-token logits of ``ids`` computed through a fresh paged cache stored as ``fmt``
    (the engine's own cache and requests are left alone)."""
    shape = KVShape.from_config(engine.loaded.model.config, engine.loaded.dtype, fmt)
    blocks = -(-len(ids) // engine.block_size)
    cache = KVCache(shape, blocks, engine.block_size, engine.device)
    table, rows = list(range(blocks)), []
    for start in range(0, len(ids), CHUNK):
        end = min(start + CHUNK, len(ids))
        meta = build_metadata(cache, [SequenceSlice(0, start, end, table)], engine.device, "torch",
                              engine.loaded.dtype)
        chunk = torch.tensor(ids[start:end], device=engine.device)
        rows.append(engine.runner.logits(chunk, meta, torch.arange(end - start, device=engine.device)).float())
    return torch.cat(rows)


def text_ids(engine: Engine, limit: int | None = None) -> list[int]:
    """The shipped text's tokens (the first ``limit``)."""
    return engine.tokenizer.encode(eval_text(), add_special_tokens=False)[:limit]


def measure_quality(engine: Engine, names: tuple[str, ...], ids: list[int]) -> dict[str, _Quality]:
    """Perplexity, KL divergence and top-1 agreement of each format against float32, window by window."""
    quality = {name: _Quality() for name in names}
    for start in range(0, len(ids) - 1, WINDOW):
        window = ids[start:start + WINDOW + 1]
        targets = torch.tensor(window[1:], device=engine.device)
        reference = window_logits(engine, FORMATS["float32"], window[:-1])
        for name in names:
            got = reference if name == "float32" else window_logits(engine, FORMATS[name], window[:-1])
            add_scores(quality[name], reference, got, targets)
    return quality


def add_scores(quality: _Quality, reference: torch.Tensor, got: torch.Tensor, targets: torch.Tensor) -> None:
    """Add one window's scores of ``got`` logits against ``reference`` ones to ``quality``. The log-probabilities
    are taken in float64, CHUNK rows at a time: a format whose logits differ from float32's only in the last
    bits (float16 keys and values on a small model) keeps a KL divergence above float32's rounding noise, which
    would otherwise make it come out slightly negative."""
    for rows in torch.split(torch.arange(len(targets), device=targets.device), CHUNK):
        expected = torch.log_softmax(reference[rows].double(), dim=-1)
        actual = expected if got is reference else torch.log_softmax(got[rows].double(), dim=-1)
        quality.nll -= float(actual.gather(1, targets[rows, None]).sum())
        quality.kl += float((expected.exp() * (expected - actual)).sum())
        quality.agreed += int((actual.argmax(-1) == expected.argmax(-1)).sum())
        quality.positions += len(rows)


def measure_speed(config: EngineConfig, names: tuple[str, ...], progress: Callable[[str], None]
                  ) -> dict[str, dict[int, float]]:
    """Decode tokens/s of each format at each of :data:`CHATS`, the best of :data:`ROUNDS` interleaved rounds."""
    best: dict[str, dict[int, float]] = {name: dict.fromkeys(CHATS, 0.0) for name in names}
    engine = None
    for round_index in range(ROUNDS):
        for name in names:
            each = dataclasses.replace(config, kv_cache_dtype=name)
            if engine is None:
                engine = Engine(each)
            else:
                engine.switch_model(each)
            words = eval_text().split()
            for chats in CHATS:
                prompts = [sized_prompt(engine, TOPICS[i % len(TOPICS)], words[(round_index * 97 + 31 * i):],
                                        PROMPT_TOKENS) for i in range(chats)]
                rate = kvasir_load(engine, prompts, NEW_TOKENS).decode_tokens_per_s or 0.0
                best[name][chats] = max(best[name][chats], rate)
                progress(f"kv {name}: round {round_index + 1}, {chats} chats: {rate:.1f} tok/s")
    return best


def evaluate_kv(model: str = "default", device: str = "auto", quantization: str = "auto",
                progress: Callable[[str], None] = print, record: bool = True) -> list[KVRow]:
    """Measure every KV format of ``model`` (see the module's docstring); ``record`` keeps the rows for
    ``kv_cache_dtype="auto"``."""
    config = EngineConfig(model=model, device=device, quantization=quantization, kv_cache_dtype="float32",
                          max_num_seqs=max(CHATS), kv_disk_cache=False)  # no disk writes beside the timed steps
    engine = Engine(config)
    names = formats_for(engine)
    progress(f"scoring the text through a cache in each of {', '.join(names)}")
    quality = measure_quality(engine, names, text_ids(engine))
    source, loaded_quantization, on = engine.loaded.source, engine.loaded.quantization, engine.device
    config = dataclasses.replace(config, quantization=loaded_quantization)
    del engine
    speed = measure_speed(config, names, progress)
    rows = [KVRow(name, math.exp(q.nll / q.positions), q.kl / q.positions, q.agreed / q.positions,
                  speed[name][CHATS[0]], speed[name][CHATS[-1]], _bytes_per_token(config, name))
            for name, q in quality.items()]
    if record:
        kv_verdicts.record(source, loaded_quantization, on, rows)
    return rows


def _bytes_per_token(config: EngineConfig, name: str) -> int:
    from ..models.fit import estimate

    return estimate(dataclasses.replace(config, kv_cache_dtype=name)).kv_bytes_per_token


def markdown_table(rows: list[KVRow], model_name: str, device: str) -> str:
    """The rows as the README shows them, with whether ``auto`` may take each."""
    reference = next(r for r in rows if r.kv_dtype == "float32")
    lines = [
        f"| KV cache ({model_name} on {device}) | bytes per token | perplexity | KL vs float32 | top-1 agreement "
        f"| decode tok/s, 1 chat | 16 chats | auto may take it |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        verdict = "reference" if r is reference else ("yes" if r.passes(reference) else f"no: {r.why_not(reference)}")
        lines.append(f"| `{r.kv_dtype}` | {r.bytes_per_token:,} | {r.perplexity:.3f} | {r.kl_divergence:.5f} | "
                     f"{r.top1_agreement:.2%} | {r.decode_tokens_per_s_1:.1f} | {r.decode_tokens_per_s_16:.1f} | "
                     f"{verdict} |")
    lines.append(f"\nThresholds for `auto`: KL <= {THRESHOLDS.max_kl}, top-1 >= {THRESHOLDS.min_top1:.0%}, decode "
                 f"at 16 chats >= {THRESHOLDS.min_speed_ratio:.2f}x float32's.")
    return "\n".join(lines)


# -- the app's one-click check -------------------------------------------------------------------------------------

CHECK_TOKENS = 1024  # of the shipped text: a few seconds a format on the CPU


@dataclasses.dataclass(frozen=True, slots=True)
class KVQuality:
    """One format's quality against a float32 cache on the loaded model (no speed: that needs a reload)."""

    kv_dtype: str
    kl_divergence: float
    top1_agreement: float
    perplexity: float
    bytes_per_token: int

    def summary(self) -> str:
        return f"KL {self.kl_divergence:.4f}, top-1 {self.top1_agreement:.1%}"


def check_kv_formats(engine: Engine) -> list[KVQuality]:
    """Every format the loaded model can use, scored on the first :data:`CHECK_TOKENS` tokens of the shipped text
    through a cache of its own (the engine's requests and cache are left alone; run it on the engine's thread)."""
    shape = engine.kv_cache.shape
    names = formats_for(engine)
    quality = measure_quality(engine, names, text_ids(engine, CHECK_TOKENS + 1))
    return [KVQuality(name, q.kl / q.positions, q.agreed / q.positions, math.exp(q.nll / q.positions),
                      dataclasses.replace(shape, stored_as=FORMATS[name]).bytes_per_token())
            for name, q in quality.items()]
