"""Which attention backend a step runs, and why: flash-attn, FlexAttention or torch's SDPA path."""

from __future__ import annotations

ATTENTION_BACKENDS = ("auto", "torch", "flash_attn", "flex")


def choose_backend(wanted: str, on_cuda: bool, flash_problem: str | None, flex_problem: str | None) -> tuple[str, str]:
    """The backend for ``wanted`` (one of :data:`ATTENTION_BACKENDS`) and the reason shown in the stats.

    ``flash_problem`` / ``flex_problem``: why flash-attn / compiled FlexAttention can't run this model here
    (None when they can). On CUDA ``auto`` takes flash-attn, else the torch path; on the CPU the torch path.
    FlexAttention runs only when asked for by name: its kernels compile on first use of each shape bucket (seconds
    each, a pause in a chat), and it has not yet been measured against the torch path on a GPU
    (``engine/tools/gpu_check.py`` does that: its ``flex_vs_torch`` part). A backend asked for by name that can't
    run raises ``ValueError`` with the reason.
    """
    if wanted not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, not {wanted!r}")
    if wanted == "torch":
        return "torch", "chosen in the settings"
    if wanted == "flex":
        if flex_problem is not None:
            raise ValueError(f"attention_backend='flex' was asked for, but {flex_problem}")
        return "flex", "chosen in the settings" + ("" if on_cuda else "; uncompiled on the CPU (a reference path)")
    if not on_cuda:
        if wanted == "flash_attn":
            raise ValueError("the flash_attn backend needs a CUDA device")
        return "torch", "flash-attn runs on CUDA only"
    if flash_problem is None:
        return "flash_attn", "flash-attn's paged kernel"
    if wanted == "flash_attn":
        raise ValueError(f"attention_backend='flash_attn' was asked for, but {flash_problem}")
    return "torch", f"{flash_problem}; FlexAttention only when asked for (attention_backend='flex')"
