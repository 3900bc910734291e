"""The correctness oracle: transformers' own ``generate``, greedy, one prompt at a time."""

from __future__ import annotations

import torch


def reference_greedy(model, prompt_ids: list[int], max_new_tokens: int, eos_ids=()) -> list[int]:
    """Greedy continuation of ``prompt_ids`` by ``model.generate``, cut after the first EOS like the engine."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt_ids]),
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=list(eos_ids) or None,
            pad_token_id=0,
        )[0, len(prompt_ids) :].tolist()
    for i, token in enumerate(out):
        if token in eos_ids:
            return out[: i + 1]
    return out


def load_reference(folder, dtype=torch.float32, kv_cache_dtype: str | None = None):
    """A plain transformers model from ``folder`` (sdpa attention), independent of the engine's copy.

    ``kv_cache_dtype``: every key and value the attention reads is first rounded as that KV format stores it
    (transformers' own cache keeps the exact values and they are rounded again at each step, the same way), so
    the reference computes what an engine with that cache computes.
    """
    from transformers import AutoModelForCausalLM

    attention = "sdpa" if kv_cache_dtype is None else _rounding_sdpa(kv_cache_dtype)
    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attention).eval()


def _rounding_sdpa(kv_cache_dtype: str) -> str:
    """transformers' sdpa attention over keys and values stored as ``kv_cache_dtype``; registered, by name."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from engine.serving.kv_format import decode, encode, format_for

    fmt = format_for(kv_cache_dtype, torch.float32)

    def rounded(x):
        return decode(fmt, *encode(fmt, x), x.dtype)

    def attention(module, query, key, value, *args, **kwargs):
        return sdpa_attention_forward(module, query, rounded(key), rounded(value), *args, **kwargs)

    name = f"sdpa_kv_{kv_cache_dtype}"
    AttentionInterface.register(name, attention)
    return name
