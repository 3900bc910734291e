"""The live panel's numbers in words: durations, sizes, the device, the CPU threads, the GPU's memory and load,
and speculative decoding."""

from __future__ import annotations

from engine import CpuUsage, EngineStats, GpuUsage, SpeculationStats

from ..units import size_text


def ms_text(seconds: float | None) -> str:
    """A short duration: "–" when unknown, "<1 ms", "240 ms", "12.5 s"."""
    if seconds is None:
        return "–"
    if seconds < 0.001:
        return "<1 ms"
    if seconds < 10:
        return f"{seconds * 1000:,.0f} ms"
    return f"{seconds:,.1f} s"


def device_text(stats: EngineStats) -> str:
    """The device and why it was chosen: "CPU — torch was built without CUDA", "cuda — CUDA GPU: …"."""
    name = "CPU" if stats.device == "cpu" else stats.device
    return f"{name} — {stats.device_reason}" if stats.device_reason else name


def gpu_memory_text(gpu: GpuUsage) -> str:
    """Memory in use on the GPU (every process) and the part this app's allocator holds."""
    return (f"{size_text(gpu.memory_used_bytes)} of {size_text(gpu.memory_total_bytes)} in use "
            f"({size_text(gpu.memory_reserved_bytes)} held by Kvasir)")


def gpu_load_text(gpu: GpuUsage) -> str:
    """The share of time a kernel ran, or why that is not known."""
    if gpu.utilization_percent is None:
        return gpu.utilization_note or "not available"
    return f"{gpu.utilization_percent}% busy"


RECENT_CONTENTION_S = 60  # other programs taking a core this recently are still mentioned


def cpu_threads_text(cpu: CpuUsage) -> str:
    """The steps' threads and why: "2 of 2", "1 of 2, another program is busy", "2 of 2 (fixed), ..." """
    text = f"{cpu.threads} of {cpu.cores}" + (" (fixed)" if cpu.threads_fixed else "")
    seen = cpu.contention_seen_s_ago
    if seen is not None and seen < RECENT_CONTENTION_S:
        text += ", others busy now" if seen < 2 else f", others busy {seen:.0f} s ago"
    if cpu.lower_priority:
        text += ", lower priority"
    return text


def speculation_text(spec: SpeculationStats | None) -> str:
    """Speculative decoding in a short line: "off", "auto, no draft yet", or "412 of 520 kept (79%), 1.9x" (draft
    tokens kept, and the measured speed-up of steps with drafts)."""
    if spec is None:
        return "–"
    if spec.mode == "off":
        return "off"
    if not spec.draft_tokens_total:
        return f"{spec.mode}, no draft yet"
    text = f"{spec.accepted_draft_tokens_total:,} of {spec.draft_tokens_total:,} kept ({spec.acceptance_rate:.0%})"
    return text + (f", {spec.speedup:.1f}x" if spec.speedup else "")


def speculation_tip(spec: SpeculationStats | None) -> str:
    """What the Drafts row's numbers are, and what the mode is doing and why."""
    if spec is None:
        return ""
    model = (f"Draft model {spec.draft_model}: {size_text(spec.draft_memory_bytes)} with its KV cache. "
             if spec.draft_model else "")
    if not spec.num_drafts_total:
        return model + spec.reason
    return (f"{model}Draft tokens kept of those computed, {spec.mean_accepted_run:.1f} kept a draft on average, "
            f"and steps with drafts against plain ones. {spec.reason[0].upper()}{spec.reason[1:]}.")


def errors_text(count: int) -> str:
    return "none since start" if count == 0 else f"{count:,} since start"
