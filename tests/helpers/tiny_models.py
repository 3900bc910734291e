"""Tiny random-weight decoder models, written to disk in Hugging Face format (seconds on a CPU)."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

VOCAB = 49152  # the default model's tokenizer
COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=2048,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
    tie_word_embeddings=False,
)

# (model_type, extra config). GQA in llama, qwen2 and qwen3; plain multi-head in mistral and phi3.
ARCHITECTURES: dict[str, dict] = {
    "llama": dict(num_key_value_heads=2),
    "qwen2": dict(num_key_value_heads=2, use_sliding_window=False),
    "qwen3": dict(num_key_value_heads=1, head_dim=32),
    "mistral": dict(num_key_value_heads=4, sliding_window=None),
    "phi3": dict(num_key_value_heads=4, pad_token_id=0),
}


def write_tiny_model(model_type: str, folder: Path, tokenizer_dir: Path, seed: int = 0, **overrides) -> Path:
    """Create a random-weight model of ``model_type`` in ``folder`` and return the folder."""
    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, **{**COMMON, **ARCHITECTURES.get(model_type, {}), **overrides})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _spread_weights(model)
    model.save_pretrained(folder, safe_serialization=True)
    for file in Path(tokenizer_dir).iterdir():
        shutil.copy(file, folder / file.name)
    return folder


def _spread_weights(model: torch.nn.Module) -> None:
    """Larger-than-default random weights, so logits are well separated and greedy choices are stable."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.08 if "embed" not in name else 1.0)
