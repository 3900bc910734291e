"""Which models can draft for a model (speculative decoding, engine/serving/draft_model.py): the same tokens,
and fewer weight bytes.

A draft's tokens must mean what the serving model's mean: the same vocabulary, token for token, and the same
end-of-text token (:func:`tokenizer_mismatch`, which a load checks too). And a draft must be cheaper to run than
the model it drafts for, or checking its guesses costs more than it saves: its weights, as it would load, take
fewer bytes than the serving model's. A model may draft for itself at fewer bits (a float32 model with its own
int4 copy).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from ..devices import resolve_device, resolve_dtype
from ..errors import ModelLoadError
from ..serving.kv_format import draft_kv_format
from .fit import model_plan
from .sizes import kv_bytes_per_token
from .sources import resolve_source

log = logging.getLogger(__name__)

DRAFT_QUANTIZATION = "int4"  # how a draft offered here loads: the fewest bytes a token


@dataclass(frozen=True, slots=True)
class DraftCandidate:
    """A model that can draft for another, as it would load beside it."""

    spec: str  # EngineConfig(draft_model=spec)
    name: str
    quantization: str
    weight_bytes: int
    kv_bytes_per_token: int  # its KV beside each token of the pool


def tokenizer_mismatch(target, draft) -> str | None:
    """Why ``draft``'s tokens would not mean the same as ``target``'s (None: they do). The two vocabularies must
    be the same, token for token, and so must the end-of-text token."""
    target_vocab, draft_vocab = target.get_vocab(), draft.get_vocab()
    if target_vocab != draft_vocab:
        differing = len(set(target_vocab.items()) ^ set(draft_vocab.items()))
        return (f"its tokenizer is not the serving model's ({len(draft_vocab):,} tokens against "
                f"{len(target_vocab):,}, {differing:,} entries differ)")
    if target.eos_token_id != draft.eos_token_id:
        return f"its end-of-text token is {draft.eos_token_id}, the serving model's is {target.eos_token_id}"
    return None


def tokens_fingerprint(tokenizer) -> str:
    """A digest of what :func:`tokenizer_mismatch` compares: equal digests, the same tokens."""
    vocab = sorted(tokenizer.get_vocab().items())
    return hashlib.sha256(json.dumps([vocab, tokenizer.eos_token_id]).encode()).hexdigest()


class _Fingerprints:
    """Each model's tokens fingerprint, read once per version of its files (a tokenizer takes a second to read)."""

    def __init__(self) -> None:
        self._known: dict[tuple, str] = {}
        self._lock = threading.Lock()

    def of(self, spec: str) -> str:
        from .loader import load_tokenizer

        source = resolve_source(spec, download=False)
        key = _files_version(source.path)
        with self._lock:
            known = self._known.get(key)
        if known is None:
            tokenizer, _ = load_tokenizer(source)
            known = tokens_fingerprint(tokenizer)
            with self._lock:
                self._known[key] = known
        return known


def _files_version(path: Path) -> tuple:
    """A GGUF file's, or a model folder's files', paths, sizes and modification times."""
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    return tuple((str(p.resolve()), p.stat().st_mtime_ns, p.stat().st_size) for p in files)


FINGERPRINTS = _Fingerprints()


def draft_candidates(target: str, quantization: str, specs: list[str], device: str = "auto"
                     ) -> list[DraftCandidate]:
    """The models among ``specs`` that can draft for ``target`` loaded in ``quantization`` on ``device``: the
    same tokens, and fewer weight bytes at :data:`DRAFT_QUANTIZATION`. ``target`` itself is among them where its
    own int4 copy is smaller. A model whose files cannot be read is left out (logged)."""
    torch_device, _ = resolve_device(device)
    dtype = resolve_dtype("auto", torch_device)
    target_info, target_plan, target_kv = model_plan(target, quantization, "auto", torch_device, dtype)
    wanted = FINGERPRINTS.of(target)
    found = []
    for spec in specs:
        try:
            info, plan, _ = model_plan(spec, DRAFT_QUANTIZATION, "auto", torch_device, dtype)
            if plan.weight_bytes >= target_plan.weight_bytes or FINGERPRINTS.of(spec) != wanted:
                continue
        except (ModelLoadError, OSError) as exc:
            log.warning("%s is not offered as a draft for %s: %s", spec, target_info.name, exc)
            continue
        found.append(DraftCandidate(spec, info.name, plan.quantization, plan.weight_bytes,
                                    kv_bytes_per_token(info, dtype, draft_kv_format(target_kv, target_info.head_dim,
                                                                                    info.head_dim, dtype))))
    return found
