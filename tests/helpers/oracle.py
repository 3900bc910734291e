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


def load_reference(folder, dtype=torch.float32):
    """A plain transformers model from ``folder`` (sdpa attention), independent of the engine's copy."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa").eval()
