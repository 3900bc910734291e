"""Will a model on the Hub fit on this machine? Estimated before it is downloaded, from remote headers.

The safetensors weights' headers (read by huggingface_hub with a Range request per shard) and config.json go
into a skeleton folder whose weight files are sparse: their header, then a hole to the data's size. The same
checks and the same estimate as for a downloaded model then run on it (:func:`fit.estimate`). (Sparse files
take no disk space on the usual Linux and macOS file systems.)

A GGUF repository's files are one model in several quantisations: the header of its smallest file (read from
the start with Range requests, grown until it parses, then made sparse to the file's size) gives the shapes,
exact for that file; the others' weights are estimated from their quantisation by name (their own headers are
megabytes each). Hence "estimate" on every label.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..config import PACKED_MODES, EngineConfig
from ..devices import choose_quantization, resolve_device, resolve_dtype
from ..errors import EngineError, HubError, ModelLoadError
from .fit import (
    FitEstimate,
    OutputHead,
    WeightPlan,
    estimate,
    estimate_weights,
    host_load_bytes,
    output_head,
    weight_bytes,
)
from .gguf_info import read_gguf_info
from .hub_api import API_TIMEOUT_S, fetch_bytes, hub_api, in_words
from .hub_search import HubOption, HubRepo
from .model_info import ModelInfo, read_model_info
from .sources import resolve_source
from .weights_check import INDEX_NAME

GGUF_HEADER_FIRST = 4 * 1024**2  # most headers (a 150k-token vocabulary included) fit in this
GGUF_HEADER_MAX = 64 * 1024**2
COMFORTABLE_CONTEXT = 8192  # below this much context (or the model's whole context, if shorter) it is "tight"


@dataclass(frozen=True, slots=True)
class HubFit:
    """The verdict for one option: "fits", "tight" (loads, with less context), "too big" or "unknown"."""

    verdict: str
    context_tokens: int = 0  # tokens of context the memory left beside the weights holds
    estimate: FitEstimate | None = None
    reason: str = ""

    def label(self) -> str:
        """A few words for a table cell: "fits: 32,768 tokens (estimate)"."""
        if self.verdict == "unknown":
            return "unknown"
        if self.verdict == "too big":
            return "too big (estimate)"
        return f"{self.verdict}: {self.context_tokens:,} tokens (estimate)"

    def explanation(self) -> str:
        """The estimate in a sentence, or why there is none."""
        if self.estimate is None:
            return self.reason
        return f"Estimate before download: {self.estimate.summary()}."


def fit_options(repo: HubRepo, quantization: str = "auto", device: str = "auto",
                address: str | None = None) -> dict[str, HubFit]:
    """A :class:`HubFit` per option of ``repo`` (by option name), reading only headers from the Hub."""
    config = EngineConfig(quantization=quantization, device=device)
    fits: dict[str, HubFit] = {}
    with tempfile.TemporaryDirectory(prefix="kvasir-hub-fit-") as tmp:
        for option in repo.options:
            if option.kind == "hf" and option.problem is None:
                fits[option.name] = _guarded(lambda o=option: _safetensors_fit(repo, o, config, Path(tmp), address))
        ggufs = [o for o in repo.options if o.kind == "gguf" and o.problem is None]
        if ggufs:
            fits.update(_guarded_all(ggufs, lambda: _gguf_fits(repo, ggufs, config, Path(tmp), address)))
    for option in repo.options:
        fits.setdefault(option.name, HubFit("unknown", reason=option.problem or ""))
    return fits


def _guarded(compute) -> HubFit:
    try:
        return compute()
    except (EngineError, ValueError) as exc:  # the headers can't be fetched, or the model can't be served
        return HubFit("unknown", reason=_why_unknown(exc))


def _guarded_all(options: list[HubOption], compute) -> dict[str, HubFit]:
    try:
        return compute()
    except (EngineError, ValueError) as exc:
        return {o.name: HubFit("unknown", reason=_why_unknown(exc)) for o in options}


def _why_unknown(exc: Exception) -> str:
    return f"Not estimated: {exc}" if isinstance(exc, HubError) else f"Can't be loaded: {exc}"


def verdict(fit: FitEstimate) -> HubFit:
    """Fits, tight or too big, and the context that fits, from an estimate."""
    context = min(fit.kv_tokens, fit.context_length)
    if not fit.fits:
        return HubFit("too big", context, fit)
    enough = min(fit.context_length, COMFORTABLE_CONTEXT)
    return HubFit("fits" if context >= enough else "tight", context, fit)


# -- safetensors -------------------------------------------------------------------------------------------

def _safetensors_fit(repo: HubRepo, option: HubOption, config: EngineConfig, tmp: Path,
                     address: str | None) -> HubFit:
    folder = tmp / "safetensors"
    folder.mkdir()
    names = {f.path for f in option.files}
    for small in ("config.json", INDEX_NAME):
        if small in names:
            (folder / small).write_bytes(fetch_bytes(repo.repo_id, small, repo.revision, address))
    api = hub_api(address)
    for file in option.weight_files:
        with in_words(f"the header of {file.path} could not be read", api.endpoint):
            meta = api.parse_safetensors_file_metadata(repo.repo_id, file.path, revision=repo.revision,
                                                       timeout=API_TIMEOUT_S)
        _write_sparse_safetensors(folder / file.path, meta)
    fit = estimate(dataclasses.replace(config, model=str(folder)))
    return verdict(fit)


def _write_sparse_safetensors(path: Path, meta) -> None:
    """A safetensors file with the remote header and a hole where the data would be."""
    header = {name: {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": list(t.data_offsets)}
              for name, t in meta.tensors.items()}
    if meta.metadata:
        header["__metadata__"] = meta.metadata
    raw = json.dumps(header).encode()
    data = max((t.data_offsets[1] for t in meta.tensors.values()), default=0)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + data)


# -- GGUF ----------------------------------------------------------------------------------------------------

def _gguf_fits(repo: HubRepo, options: list[HubOption], config: EngineConfig, tmp: Path,
               address: str | None) -> dict[str, HubFit]:
    sample = min(options, key=lambda o: o.size)
    source = resolve_source(str(_sparse_gguf(repo, sample, tmp, address)))
    info = read_model_info(source)
    device, _ = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    fits = {}
    for option in options:
        if option is sample:
            fit = estimate(dataclasses.replace(config, model=str(source.path)))
        else:
            plan = _gguf_plan(info, option, config.quantization, source, device, dtype)
            fit = estimate_weights(_sized(info, option), config, plan, device, dtype)
        fits[option.name] = verdict(fit)
    return fits


def _gguf_plan(info: ModelInfo, option: HubOption, spec: str, source, device, dtype) -> WeightPlan:
    """Weights of a GGUF file known by its name only: the shapes of the sampled file, the types of its name."""
    quantization = choose_quantization(spec, device, info=info, gguf_type=option.quantization)[0]
    head = None
    if quantization in PACKED_MODES:
        sampled = output_head(source)
        head = OutputHead(sampled.rows, sampled.cols, sampled.tied, _embedding_type(option.quantization))
    q4_k = info.linear_parameter_count if quantization == "int4" and option.quantization.startswith("Q4_K") else 0
    weights = weight_bytes(info, quantization, dtype, head, device, q4_k)
    return WeightPlan(quantization, weights, host_load_bytes(source, info, quantization, dtype, device))


def _embedding_type(quantization: str) -> str | None:
    """The embedding's type as llama.cpp's quantiser writes it for ``quantization``: the base type ("Q4_K" in a
    Q4_K_M file), Q8_0 in the _L / _XL releases; None (held as floats, the larger guess) when it can't say."""
    if quantization.endswith(("_K_L", "_K_XL")) and quantization != "Q3_K_L":  # Q3_K_L is llama.cpp's own
        return "Q8_0"
    parts = quantization.split("_")
    return "_".join(parts[:2]) if len(parts) >= 2 else None


def _sized(info: ModelInfo, option: HubOption) -> ModelInfo:
    """The sampled file's description, named and sized as ``option``."""
    return ModelInfo(**{**info.to_dict(), "name": Path(option.name).stem, "size_on_disk": option.size})


def _sparse_gguf(repo: HubRepo, option: HubOption, tmp: Path, address: str | None) -> Path:
    """The GGUF file's header, read from the Hub until it parses, then a hole to the file's size."""
    path = tmp / Path(option.name).name
    size, wanted = option.size, GGUF_HEADER_FIRST
    while True:
        end = min(wanted, size)
        path.write_bytes(fetch_bytes(repo.repo_id, option.name, repo.revision, address, (0, end)))
        try:
            read_gguf_info(path)
            break
        except ModelLoadError:
            if end >= size or wanted >= GGUF_HEADER_MAX:
                raise  # the whole header was there and it does not parse: the file is damaged
            wanted *= 4
    os.truncate(path, size)
    return path

