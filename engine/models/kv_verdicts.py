"""What ``eval-quant --kv`` (or the app's one-click check) measured of each KV cache format on a model, kept in the
user cache folder so that ``kv_cache_dtype="auto"`` chooses by measurement: the smallest format whose quality and
speed met :data:`THRESHOLDS` on this model file, with this weight quantisation, on this kind of device.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ..serving.kv_format import KVFormat, choose_kv_format
from .gguf_cache import cache_root
from .sources import ModelSource
from .weights_check import weight_files

log = logging.getLogger(__name__)

VERDICTS_FILE = "kv-verdicts.json"
VERSION = 1


@dataclass(frozen=True, slots=True)
class Thresholds:
    """What a KV format must keep against a float32 cache for ``auto`` to take it."""

    max_kl: float = 0.002  # mean KL divergence of next-token distributions, nats
    min_top1: float = 0.99  # share of positions whose most likely next token is the same
    # decode tok/s at 16 chats against the float32 cache's, measured in the same run: 'no slower', with the
    # 3% that separates two runs of the same configuration on this machine
    min_speed_ratio: float = 0.97


THRESHOLDS = Thresholds()


@dataclass(frozen=True, slots=True)
class KVRow:
    """One KV format measured on a model (``eval-quant --kv``)."""

    kv_dtype: str
    perplexity: float
    kl_divergence: float  # mean over the scored positions, against the float32 cache
    top1_agreement: float  # 0..1
    decode_tokens_per_s_1: float
    decode_tokens_per_s_16: float
    bytes_per_token: int

    def passes(self, reference: KVRow, limits: Thresholds = THRESHOLDS) -> bool:
        """Whether this format met every threshold against ``reference`` (the float32 row of the same run)."""
        fast_enough = self.decode_tokens_per_s_16 >= limits.min_speed_ratio * reference.decode_tokens_per_s_16
        return self.kl_divergence <= limits.max_kl and self.top1_agreement >= limits.min_top1 and fast_enough

    def why_not(self, reference: KVRow, limits: Thresholds = THRESHOLDS) -> str:
        """The thresholds this row missed, in words ("" when it passes)."""
        missed = []
        if self.kl_divergence > limits.max_kl:
            missed.append(f"KL {self.kl_divergence:.4f} > {limits.max_kl}")
        if self.top1_agreement < limits.min_top1:
            missed.append(f"top-1 {self.top1_agreement:.1%} < {limits.min_top1:.0%}")
        base = reference.decode_tokens_per_s_16
        ratio = self.decode_tokens_per_s_16 / base if base else 0.0
        if ratio < limits.min_speed_ratio:
            missed.append(f"{ratio:.2f}x the float32 cache's speed at 16 chats")
        return ", ".join(missed)


def model_key(source: ModelSource, quantization: str, device: torch.device) -> str:
    """One model as its files are now (their sizes and times: a GGUF file, or a folder's config and weight
    files, which can be rewritten in place), loaded with ``quantization``, on this kind of device."""
    files = [source.path] if source.kind == "gguf" else [source.folder / "config.json", *weight_files(source.folder)]
    stamps = []
    for file in files:
        stat = file.stat()
        stamps.append(f"{file.name}:{stat.st_size}:{stat.st_mtime_ns}")
    return f"{source.path.resolve()}|{','.join(stamps)}|{quantization}|{device.type}"


def _path() -> Path:
    return cache_root() / VERDICTS_FILE


def _read_all() -> dict:
    try:
        data = json.loads(_path().read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring the KV format measurements in %s: %s", _path(), exc)
        return {}
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("models"), dict):
        return {}
    return data["models"]


def measured_rows(source: ModelSource, quantization: str, device: torch.device) -> list[KVRow] | None:
    """The rows last measured for this model, or None."""
    entry = _read_all().get(model_key(source, quantization, device))
    try:
        rows = [KVRow(**row) for row in entry["rows"]]
    except (KeyError, TypeError, AttributeError):  # not an entry, or rows missing a field or with others
        return None
    numbers = [getattr(row, f) for row in rows for f in ("perplexity", "kl_divergence", "top1_agreement",
                                                         "decode_tokens_per_s_1", "decode_tokens_per_s_16")]
    if not all(isinstance(n, int | float) and not isinstance(n, bool) for n in numbers):
        return None
    return rows


def passing_formats(rows: list[KVRow] | None) -> frozenset[str] | None:
    """The formats of ``rows`` that met the thresholds against their float32 row (None: nothing to judge by)."""
    reference = next((row for row in rows or () if row.kv_dtype == "float32"), None)
    if reference is None:
        return None
    return frozenset(row.kv_dtype for row in rows if row.passes(reference))


def record(source: ModelSource, quantization: str, device: torch.device, rows: list[KVRow]) -> None:
    """Keep ``rows`` as this model's measurement (replacing an earlier one); written whole, then renamed."""
    models = _read_all()
    models[model_key(source, quantization, device)] = {"measured": time.strftime("%Y-%m-%d %H:%M:%S"),
                                                       "rows": [asdict(row) for row in rows]}
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    staging.write_text(json.dumps({"version": VERSION, "models": models}, indent=1))
    os.replace(staging, path)


def kv_format_for(wanted: str, source: ModelSource, quantization: str, head_dim: int, device: torch.device,
                  dtype: torch.dtype) -> tuple[KVFormat, str]:
    """The one rule for the KV format a model gets (the engine and the fit estimate both ask here)."""
    passing = passing_formats(measured_rows(source, quantization, device)) if wanted == "auto" else None
    return choose_kv_format(wanted, dtype, head_dim, device, passing)
