"""Engine configuration."""

from __future__ import annotations

from dataclasses import dataclass

from .step.attention_backend import ATTENTION_BACKENDS

# The quantisation families, named once: packed weight-only layers (engine/step/block_linear.py on the CPU,
# engine/step/packed_linear.py on CUDA) and bitsandbytes' layers
PACKED_MODES = ("int4", "w8")
BITSANDBYTES_MODES = ("int8", "nf4", "fp4")
QUANTIZATIONS = ("auto", "none", *PACKED_MODES, *BITSANDBYTES_MODES)
WEIGHT_MODES = QUANTIZATIONS[1:]  # what ``auto`` chooses between
AUTO_QUANTIZATION_RULE = ("auto: on CUDA the compute dtype where the model fits, else nf4; on the CPU int4 or w8 "
                          "for a 4- or 8-bit GGUF file, else none")
DTYPES = ("auto", "float32", "bfloat16", "float16")
# how the KV cache stores keys and values (engine/serving/kv_format.py)
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "float16", "q8_0", "fp8")
SPECULATION_MODES = ("auto", "off", "ngram", "draft")  # engine/serving/speculation.py


@dataclass(slots=True)
class EngineConfig:
    """Everything that fixes how the engine loads a model and shares its KV cache."""

    model: str = "default"
    quantization: str = "auto"  # see AUTO_QUANTIZATION_RULE
    dtype: str = "auto"
    device: str = "auto"
    block_size: int = 16
    num_kv_blocks: int | None = None
    kv_cache_memory: int | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    # how keys and values are stored (engine/serving/kv_format.py); auto: the smallest format measured to keep
    # quality and speed on this model (engine/models/kv_verdicts.py), else the compute dtype
    kv_cache_dtype: str = "auto"
    # speculative decoding (engine/serving/speculation.py): auto drafts where measurement says it pays (with the
    # draft model where one is loaded, else from earlier text); ngram drafts from earlier text whenever lookup
    # finds some; draft always drafts with the draft model; off never drafts
    speculation: str = "auto"
    # a model loaded beside this one to write drafts (engine/serving/draft_model.py), in the same pool: any model
    # whose tokenizer is this one's, such as this model itself more quantised
    draft_model: str | None = None
    draft_quantization: str = "auto"
    # the prefix cache's disk tier (engine/serving/kv_disk.py): full KV blocks kept in the user cache folder, so a
    # chat continued after a restart is not computed again; at most this many bytes (least recently used go first)
    kv_disk_cache: bool = True
    kv_disk_cache_bytes: int = 2 * 1024**3
    attention_backend: str = "auto"
    cuda_graphs: bool = True  # decode steps replayed from CUDA graphs on a GPU; False: every step eager
    # while replies are being written, prompt work per step is sized to keep a step within this many seconds
    # (None: 0.15 on the CPU, 0.05 on a GPU; see engine/serving/step_pacer.py)
    step_latency_target_s: float | None = None
    # CPU threads for the steps: None adapts to what other processes take (engine/serving/cpu_share.py)
    threads: int | None = None
    lower_priority: bool = False  # the engine's threads at nice +10 (engine/serving/priority.py)

    def __post_init__(self) -> None:
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of {QUANTIZATIONS}, not {self.quantization!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, not {self.dtype!r}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', not {self.device!r}")
        if self.block_size < 1:
            raise ValueError("block_size must be at least 1")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 1:
            raise ValueError("num_kv_blocks must be at least 1")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError("kv_cache_memory must be a positive number of bytes")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError("max_model_len must be at least 2")
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be at least 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be at least 1")
        if self.speculation not in SPECULATION_MODES:
            raise ValueError(f"speculation must be one of {SPECULATION_MODES}, not {self.speculation!r}")
        if self.draft_model is not None and (not isinstance(self.draft_model, str) or not self.draft_model.strip()):
            raise ValueError(f"draft_model must be a model's name or path, or None, not {self.draft_model!r}")
        if self.speculation == "draft" and self.draft_model is None:
            raise ValueError("speculation='draft' needs a draft model: set draft_model (for example the same model "
                             "as int4)")
        if self.draft_quantization not in QUANTIZATIONS:
            raise ValueError(f"draft_quantization must be one of {QUANTIZATIONS}, not {self.draft_quantization!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, not {self.kv_cache_dtype!r}")
        if not isinstance(self.kv_disk_cache, bool):
            raise ValueError(f"kv_disk_cache must be True or False, not {self.kv_disk_cache!r}")
        size = self.kv_disk_cache_bytes
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"kv_disk_cache_bytes must be a number of bytes (0 or more), not {size!r}")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, not {self.attention_backend!r}")
        if not isinstance(self.cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be True or False, not {self.cuda_graphs!r}")
        target = self.step_latency_target_s
        if target is not None and (isinstance(target, bool) or not isinstance(target, int | float) or not target > 0
                                   or target == float("inf")):
            raise ValueError(f"step_latency_target_s must be a positive number of seconds, not {target!r}")
        if self.threads is not None and (isinstance(self.threads, bool) or not isinstance(self.threads, int)
                                         or self.threads < 1):
            raise ValueError(f"threads must be None (adapt) or a whole number of at least 1, not {self.threads!r}")
        if not isinstance(self.lower_priority, bool):
            raise ValueError(f"lower_priority must be True or False, not {self.lower_priority!r}")
