"""Chat templates written for the tests in the reasoning families' formats, and a tiny model whose tokenizer
writes the end of reasoning where the model's greedy reply has a chosen token."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# Qwen3's layout: every reply starts thinking (the generation prompt opens the block) unless enable_thinking is
# false (then the block is written empty, closed); earlier replies' reasoning is dropped.
THINK_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}"
    "{%- endif %}"
)

# DeepSeek-R1's layout: the model opens its own block; earlier replies' reasoning is kept where given
# (``reasoning_content``), so a test can see a template decide.
KEEPING_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.reasoning_content %}"
    "{{- '<|im_start|>assistant\\n<think>' + message.reasoning_content + '</think>' + message.content"
    " + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Magistral's markers
MAGISTRAL_TEMPLATE = THINK_TEMPLATE.replace("<think>", "[THINK]").replace("</think>", "[/THINK]")


def with_template(model_dir: Path, folder: Path, template: str) -> Path:
    """A copy of ``model_dir`` whose chat template is ``template``."""
    shutil.copytree(model_dir, folder)
    (folder / "chat_template.jinja").write_text(template)
    config = folder / "tokenizer_config.json"
    settings = json.loads(config.read_text())
    settings.pop("chat_template", None)
    config.write_text(json.dumps(settings))
    return folder


def with_token_renamed(model_dir: Path, folder: Path, token_id: int, text: str) -> Path:
    """A copy of ``model_dir`` whose tokenizer writes ``text`` for ``token_id`` (a byte-level BPE vocabulary
    entry: ASCII text stands for itself); the merges that made the old entry go, the weights stay."""
    shutil.copytree(model_dir, folder)
    path = folder / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    vocab = tokenizer["model"]["vocab"]
    old = next(piece for piece, index in vocab.items() if index == token_id)
    del vocab[old]
    vocab[text] = token_id
    merges = tokenizer["model"]["merges"]
    tokenizer["model"]["merges"] = [m for m in merges if old not in _merge_parts(m) and "".join(_merge_parts(m)) != old]
    path.write_text(json.dumps(tokenizer))
    return folder


def _merge_parts(merge) -> list[str]:
    return merge.split(" ") if isinstance(merge, str) else list(merge)


def closing_model(think_dir: Path, folder: Path, prompt_ids: list[int], reply_ids: list[int]) -> tuple[Path, int]:
    """A copy of ``think_dir`` (a model whose template opens a reasoning block) whose tokenizer writes
    ``</think>`` for one token of ``reply_ids`` (its greedy reply to ``prompt_ids``), so the same weights close
    the block there; returns the copy and the token's place. The place is the first, past the fourth token, whose
    token has not come before and whose renaming leaves the prompt's tokens as they were."""
    from transformers import AutoTokenizer

    text = AutoTokenizer.from_pretrained(think_dir).decode(prompt_ids)
    for place in range(4, len(reply_ids) - 4):
        if reply_ids[place] in reply_ids[:place] + prompt_ids:
            continue
        shutil.rmtree(folder, ignore_errors=True)
        with_token_renamed(think_dir, folder, reply_ids[place], "</think>")
        if AutoTokenizer.from_pretrained(folder).encode(text, add_special_tokens=False) == prompt_ids:
            return folder, place
    raise AssertionError("no token of the reply can close the block")
