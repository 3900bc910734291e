"""A GGUF file's model config and tokenizer, read from its header in a fraction of a second.

transformers derives both by parsing the whole header with the ``gguf`` package's reader, the vocabulary's tens of
thousands of strings one numpy view at a time, and does it twice (once for the config, once more when
``AutoTokenizer`` looks up the config to pick the tokenizer's class): most of a minute on a busy CPU, all of it
before a first start can chat. Here the header is read once by :mod:`.gguf_info`, and the config is built with
transformers' own key tables and rules, so the result is the same config; the tokenizer is built by the class
``AutoTokenizer`` would pick, from the file directly. The architectures below are the ones whose rules this
module repeats; any other goes through transformers' own reading (slow, but the same answer).
"""

from __future__ import annotations

from pathlib import Path

from .gguf_info import GGUFInfo, read_gguf_info
from .sources import ModelSource

# architectures that transformers maps by its key tables alone (no rule of its own for the architecture)
TABLE_ONLY_ARCHITECTURES = frozenset({"llama", "qwen2", "qwen3", "phi3", "gemma2", "gemma3", "starcoder2", "nemotron"})
TEXT_ONLY_MODEL_TYPES = {"gemma3": "gemma3_text"}  # a GGUF file holds only the text part of these models


def config_dict(info: GGUFInfo) -> dict | None:
    """The config transformers would derive from the file, as a dict; None where the architecture needs rules of
    transformers' own (see :data:`TABLE_ONLY_ARCHITECTURES`)."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_TO_TRANSFORMERS_MAPPING

    architecture = info.architecture
    if architecture not in TABLE_ONLY_ARCHITECTURES:
        return None
    # transformers checks whether "mistral" is one of the name's values, i.e. the whole name
    renamed = "mistral" if architecture == "llama" and info.metadata.get("general.name") == "mistral" else architecture
    config: dict = {"tie_word_embeddings": "output.weight" not in info.tensors}
    for key, value in GGUF_CONFIG_DEFAULTS_MAPPING.get(renamed, GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture) or {}
                                                       ).items():
        config.setdefault(key, value)
    tables = GGUF_TO_TRANSFORMERS_MAPPING["config"]
    for key, value in info.metadata.items():
        prefix, _, name = key.replace(architecture, renamed).partition(".")
        target = tables.get(prefix, {}).get(name, -1)
        if target in (-1, None):
            continue
        if isinstance(value, list) and len(value) == 1:
            value = value[0]  # transformers reads a one-item array as its item
        if isinstance(value, str) and architecture in value:
            value = value.replace(architecture, renamed)
        config[target] = value
    config["model_type"] = TEXT_ONLY_MODEL_TYPES.get(config.get("model_type"), config.get("model_type"))
    if "vocab_size" not in config and info.token_count is not None:
        config["vocab_size"] = info.token_count
    return config


def read_config(source: ModelSource):
    """The transformers config of a GGUF source: from its header where :func:`config_dict` knows the
    architecture, else through transformers."""
    from transformers import AutoConfig

    values = config_dict(read_gguf_info(source.path))
    if values is None:
        return AutoConfig.from_pretrained(source.folder, gguf_file=source.gguf_file, trust_remote_code=False)
    config = AutoConfig.for_model(**values)
    config._name_or_path = str(source.folder)  # as from_pretrained names it
    return config


def read_tokenizer(source: ModelSource):
    """The tokenizer of a GGUF source, of the class ``AutoTokenizer`` picks, without its second parse of the
    header; through ``AutoTokenizer`` itself where the choice could depend on more than the config."""
    from transformers import AutoConfig, AutoTokenizer

    values = None if _folder_has_own_configs(source.folder) else config_dict(read_gguf_info(source.path))
    tokenizer_class = None if values is None else _tokenizer_class(AutoConfig.for_model(**values))
    reader = AutoTokenizer if tokenizer_class is None else tokenizer_class
    return reader.from_pretrained(source.folder, gguf_file=source.gguf_file, trust_remote_code=False)


def _tokenizer_class(config):
    """The class ``AutoTokenizer`` gives a GGUF file's config when the folder has no tokenizer config of its own:
    the one registered for the config's type, else ``TokenizersBackend``; None for Mistral's own backend, whose
    choice reads more files."""
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    chosen = TOKENIZER_MAPPING.get(type(config), TokenizersBackend)
    if chosen is None or getattr(chosen, "__name__", "") == "MistralCommonBackend":
        return None
    return chosen


def _folder_has_own_configs(folder: Path) -> bool:
    """A GGUF file beside a tokenizer_config.json or config.json: ``AutoTokenizer`` reads those too."""
    return any((folder / name).is_file() for name in ("tokenizer_config.json", "config.json"))
