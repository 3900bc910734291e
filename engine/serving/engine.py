"""The engine: requests in, streamed outputs out, one paged KV cache and one batch for all of them."""

from __future__ import annotations

import dataclasses
import gc
import itertools
import logging
import time
from collections.abc import Iterable

import torch

from ..config import EngineConfig
from ..devices import available_memory, resolve_device, resolve_dtype, resolve_quantization
from ..errors import EngineError, ModelLoadError
from ..models import kv_verdicts
from ..models.fit import FitEstimate, estimate
from ..models.gguf_cache import cache_root
from ..models.loader import LoadedModel, Progress, load_model
from ..models.memory import resident_bytes, return_freed_memory
from ..models.model_info import read_model_info
from ..models.sources import resolve_source
from ..sampling_params import SamplingParams, Structure
from ..step import attention, attention_plan, cuda_graphs
from ..step.attention_plan import AttentionPlan
from ..step.block_linear import rounds_activations
from ..step.detokenizer import IncrementalDetokenizer
from ..step.grammar import Constraint, Grammars
from ..step.runner import ModelRunner
from ..templates.reasoning import PROMPT_TAIL_TOKENS, opened_by, reasoning_support
from ..templates.tool_calls import forced_call_grammar, tool_call_format
from . import priority
from .block_manager import BlockManager
from .cpu_share import ThreadGovernor
from .draft_model import DraftModel, load_draft_model
from .draft_trials import CatchUp
from .gpu_usage import GpuMonitor
from .kv_cache import KVCache, KVShape, config_head_dim, kv_cache_blocks, release_pages
from .kv_disk import DiskTier
from .kv_format import draft_kv_format
from .metrics import CpuUsage, DiskCacheStats, EngineCounters, EngineStats, RequestMetrics, RequestSnapshot
from .outputs import RequestOutput
from .prompt_encoder import Prompt, PromptEncoder
from .reply_channels import ReplyChannels
from .scheduler import Chunk, Scheduler, SchedulerOutput
from .sequence import Sequence, Status
from .speculation import TO_DRAFT, Speculator
from .step_pacer import CPU_TARGET_S, GPU_TARGET_S, StepPacer
from .warmup import step_peak_bytes

log = logging.getLogger(__name__)

SWITCHED_MESSAGE = "the model was switched while this reply was being written"
UNLOADED_MESSAGE = "the model was unloaded while this reply was being written"
CPU_THREADS = torch.get_num_threads()  # what torch chose for this machine (or OMP_NUM_THREADS), before any change


class Engine:
    """Serves many requests at once from one model; see docs/architecture.md for the public API."""

    def __init__(self, config: EngineConfig | None = None, progress: Progress | None = None) -> None:
        self.counters = EngineCounters()
        self._sequences: dict[str, Sequence] = {}
        self._detokenizers: dict[str, IncrementalDetokenizer] = {}
        self._channels: dict[str, ReplyChannels] = {}  # each reply's reasoning and answer
        self._pending: list[RequestOutput] = []  # refused or aborted, reported by the next step
        self._ids = itertools.count()
        self._load(config or EngineConfig(), progress)

    def _load(self, config: EngineConfig, progress: Progress | None) -> None:
        """Check that ``config`` fits, then load its model and build a KV cache, scheduler and runner."""
        fit = estimate(config)
        if not fit.fits:
            raise ModelLoadError(f"this configuration does not fit in memory: {fit.summary()}")
        self.config = config
        self.device, self.device_reason = resolve_device(config.device)
        self.gpu_monitor = GpuMonitor(self.device)
        plan = self._plan_attention()
        self.attention_backend, self.attention_reason, self.block_size = plan.backend, plan.reason, plan.block_size
        block_size = self.block_size
        self.loaded: LoadedModel = load_model(config, self.device, attention.ATTENTION_NAME, progress)
        self.tokenizer = self.loaded.tokenizer
        draft = load_draft_model(config, self.device, self.tokenizer) if config.draft_model else None
        self.max_model_len = self.loaded.max_model_len
        self.prompts = PromptEncoder(self.tokenizer, self.max_model_len, self.loaded.model.config.vocab_size)
        self.reasoning = reasoning_support(self.prompts.template.source, self.tokenizer.get_vocab())
        self.tool_format = tool_call_format(self.prompts.template.source)
        self.grammars = Grammars(self.tokenizer, self.loaded.model.config.vocab_size, self._grammar_eos())
        if self.reasoning.note:
            log.info("%s: %s", config.model, self.reasoning.note)
        shape = KVShape.from_config(self.loaded.model.config, self.loaded.dtype, self.kv_format)
        self.step_peak_bytes = 0  # measured on a GPU before sizing the cache
        self.graphs_problem = cuda_graphs.graphs_problem(config.cuda_graphs, self.device, self.loaded.model,
                                                          self.attention_backend)
        # graphs pad their batches with rows that write to a block no sequence owns: one more than the budget
        reserved = 0 if self.graphs_problem else 1
        draft_shape = self._draft_kv_shape(draft)
        num_blocks = self._num_kv_blocks(shape, draft_shape.bytes_per_token() if draft else 0)
        self.kv_cache = KVCache(shape, num_blocks, block_size, self.device, reserved)
        limits = None if self.graphs_problem else cuda_graphs.GraphLimits(config.max_num_seqs, self.max_model_len)
        self.draft = None if draft is None else DraftModel(
            draft, self.kv_cache, draft_shape, self.attention_backend, self.loaded.model.config.vocab_size,
            self._draft_graph_limits(config, draft, limits), rounds_activations(self.loaded.model))
        target = config.step_latency_target_s or (GPU_TARGET_S if self.device.type == "cuda" else CPU_TARGET_S)
        self.pacer = StepPacer(target)  # what steps cost on this model and device, learnt as they run
        self._set_cpu_options(config.threads, config.lower_priority)
        self.disk = self._open_disk_tier()
        self.speculator = Speculator(config.speculation, self.draft.name if self.draft else None)
        self._new_scheduler()
        self.runner = ModelRunner(self.loaded.model, self.kv_cache, self.device, self.attention_backend, limits)
        return_freed_memory()  # what reading the files left on the heap

    def _draft_graph_limits(self, config: EngineConfig, draft: LoadedModel,
                            limits: cuda_graphs.GraphLimits | None) -> cuda_graphs.GraphLimits | None:
        """The draft model's passes replay CUDA graphs where the serving model's steps do (the pool then has the
        scratch block) and its own layers can be captured; a pass of more rows than the largest bucket (a prompt
        it catches up on) runs eagerly."""
        if limits is None:
            return None
        problem = cuda_graphs.graphs_problem(config.cuda_graphs, self.device, draft.model, self.attention_backend)
        if problem:
            log.info("the draft model's passes run eagerly: %s", problem)
            return None
        return limits

    def _draft_kv_shape(self, draft: LoadedModel | None) -> KVShape | None:
        """The draft model's KV, in the format :func:`.kv_format.draft_kv_format` gives."""
        if draft is None:
            return None
        shape = KVShape.from_config(draft.model.config, draft.dtype)
        serving_head_dim = config_head_dim(self.loaded.model.config)
        return dataclasses.replace(shape, stored_as=draft_kv_format(self.kv_format, serving_head_dim, shape.head_dim,
                                                                    draft.dtype))

    def _new_scheduler(self) -> None:
        self.block_manager = BlockManager(self.kv_cache.num_blocks, self.block_size, self.config.enable_prefix_caching)
        if self.disk is not None:
            self.disk.block_manager = self.block_manager
        self.scheduler = Scheduler(self.block_manager, self.config.max_num_seqs, self.config.max_num_batched_tokens,
                                   self.pacer, self.disk)

    def _open_disk_tier(self) -> DiskTier | None:
        """The prefix cache's disk tier, where the configuration asks for one (see :mod:`.kv_disk`)."""
        config = self.config
        if not (config.kv_disk_cache and config.enable_prefix_caching and config.kv_disk_cache_bytes > 0):
            return None
        key = kv_verdicts.model_key(self.loaded.source, self.loaded.quantization, self.device)
        try:
            return DiskTier(self.kv_cache, None, key, cache_root() / "kv-blocks", config.kv_disk_cache_bytes)
        except OSError as exc:  # an unreadable cache folder: the engine serves, without the disk tier
            log.warning("the prefix cache's disk tier is off: %s", exc)
            return None

    # -- public API ---------------------------------------------------------------------------------

    def add_request(
        self, prompt: Prompt, sampling: SamplingParams | None = None, request_id: str | None = None,
        source: str = "", constraint: Constraint | None = None,
    ) -> str:
        """Queue a request; returns its id. A request that can never fit finishes at once with an error.

        ``source`` labels who sent it (``""``: the window; ``"api"``: the local endpoint); ``stats()`` carries
        it in each :class:`RequestSnapshot` so the live panel can say where a request came from.

        A bad prompt or parameter raises ``ValueError`` (``TypeError`` for a wrong kind of object) and leaves
        nothing behind: the request is registered only once it is fully built. A structured request's grammar
        is compiled here unless ``constraint`` brings it compiled (:meth:`constraint_for`, off this thread).
        """
        sampling = SamplingParams() if sampling is None else sampling
        if not isinstance(sampling, SamplingParams):
            raise TypeError(f"sampling must be a SamplingParams, not {type(sampling).__name__}")
        if not isinstance(source, str):
            raise TypeError(f"source must be a string, not {type(source).__name__}")
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._sequences:
            raise ValueError(f"request id {request_id!r} is already in use")
        token_ids = self.encode_prompt(prompt)
        if constraint is None and sampling.structure is not None:
            constraint = self.constraint_for(sampling)
        detokenizer = IncrementalDetokenizer(self.tokenizer, token_ids, sampling.stop)
        seq = Sequence(request_id, token_ids, len(token_ids), sampling, time.perf_counter(), source=source,
                       constraint=constraint)
        self._sequences[request_id] = seq
        self._detokenizers[request_id] = detokenizer
        self._channels[request_id] = self._reply_channels(token_ids, sampling)
        problem = self._why_it_cannot_fit(seq)
        if problem:
            self._finish(seq, "error", problem)
        else:
            self.scheduler.add(seq)
        return request_id

    def constraint_for(self, sampling: SamplingParams) -> Constraint | None:
        """A fresh grammar matcher for ``sampling``'s structure (None for free text); ``GrammarError`` (a
        ``ValueError``) naming what cannot be enforced. Safe from any thread."""
        return self.grammars.constraint(sampling.structure) if sampling.structure is not None else None

    def forced_call(self, tools: list[dict], name: str | None) -> Structure:
        """The form of a reply that is one call to ``name`` (None: any of ``tools``) in this model's format."""
        return Structure("grammar", forced_call_grammar(self.tool_format, tools, name))

    def _grammar_eos(self) -> int:
        """The token a constrained reply ends with: the tokenizer's end of turn where it is one of the model's."""
        eos = self.tokenizer.eos_token_id
        return eos if eos in self.loaded.eos_token_ids or not self.loaded.eos_token_ids else min(
            self.loaded.eos_token_ids)

    def _reply_channels(self, prompt_ids: list[int], sampling: SamplingParams) -> ReplyChannels:
        """A reply's channels, as ``sampling`` asks (reasoning apart, tool calls parsed): where the prompt leaves a
        reasoning block open, the reply starts in it."""
        markers = self.reasoning.markers if sampling.split_reasoning else None
        tools = self.tool_format if sampling.parse_tool_calls else None
        if markers is None:
            return ReplyChannels(None, False, tools)
        tail = self.tokenizer.decode(prompt_ids[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
        return ReplyChannels(markers, opened_by(tail, markers), tools)

    def step(self) -> list[RequestOutput]:
        """Run one forward pass; returns an output for every request that advanced or ended.

        A failure inside the step ends only the requests it touched, each with an error output; the engine
        keeps serving the others.
        """
        self._adapt_threads()
        self._plan_drafts()
        scheduled = self._schedule()
        draft_seconds, caught_up = self._write_drafts(scheduled)
        outputs = self._compute(scheduled, draft_seconds, caught_up) if scheduled.chunks else []
        reported, self._pending = self._pending, []
        if not self.scheduler.has_unfinished():
            self._release_free_pages()
        return reported + outputs

    def _plan_drafts(self) -> None:
        """Drafts for the replies being written (speculative decoding, :mod:`.speculation`), each within what
        its reply may still take: its ``max_tokens`` and the context, less the step's own token."""
        decoding = [seq for seq in self.scheduler.decoding() if seq.constraint is None]  # a grammar's masks are
        # made for the reply's next token only
        room = {seq.request_id: min(seq.params.max_tokens - seq.num_output_tokens, self.max_model_len - seq.num_tokens)
                - 1 for seq in decoding}
        self.speculator.plan(decoding, room)

    def _write_drafts(self, scheduled: SchedulerOutput) -> tuple[float, CatchUp]:
        """The draft model's drafts for the step's chunks that have room for one (:mod:`.draft_model`): the
        seconds its passes took, and what they caught up on besides a token or two (a prompt it had not seen,
        replies it sat out: not what a step with drafts usually costs). Should it fail, the step goes on
        without drafts (and is not measured: CatchUp.PROMPT)."""
        if self.draft is None or not self.speculator.uses_draft_model:
            return 0.0, CatchUp.NONE
        chunks = [c for c in scheduled.chunks if c.draft and c.draft[0] == TO_DRAFT]
        if not chunks:
            return 0.0, CatchUp.NONE
        start = time.perf_counter()
        try:
            caught_up = self.draft.fill(chunks, self.block_manager,
                                        self.config.max_num_batched_tokens - scheduled.num_tokens)
        except Exception:
            log.exception("the draft model failed; this step goes on without drafts")
            for chunk in chunks:
                chunk.draft, chunk.num_tokens, chunk.seq.draft_computed = (), 1, 0
            return time.perf_counter() - start, CatchUp.PROMPT
        return time.perf_counter() - start, caught_up

    def _release_free_pages(self) -> None:
        """Idle on the CPU: the pages of blocks freed since, and the heap the steps' activations left, are given
        back to the system (cached blocks keep theirs), so a burst of long chats does not hold its memory for
        ever."""
        if self.device.type == "cpu":
            releasable = self.block_manager.take_releasable()
            release_pages(self.kv_cache, releasable)
            if self.draft is not None:
                release_pages(self.draft.kv_cache, releasable)
            return_freed_memory()

    def fail_all(self, error: str) -> list[RequestOutput]:
        """Last resort after an unexpected failure: end every live request with ``error`` and start the
        scheduler and block pool afresh, so the engine's state is consistent whatever went wrong."""
        outputs, self._pending = self._pending, []
        for seq in list(self._sequences.values()):
            seq.status, seq.finish_reason, seq.error = Status.FINISHED, "error", error
            self.counters.record_error()
            text, delta = self._text_so_far(seq.request_id, final=True)
            outputs.append(self._output(seq, [], delta, text))
        self._sequences.clear()
        self._detokenizers.clear()
        self._channels.clear()
        self._new_scheduler()
        return outputs

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its blocks; the next step reports it with ``finish_reason='abort'``."""
        seq = self._sequences.get(request_id)
        if seq is not None and not seq.finished:
            self._finish(seq, "abort", None)

    def set_cpu_options(self, threads: int | None, lower_priority: bool) -> None:
        """Threads for the steps (None: adapt to what other processes take) and the lower priority, at once; a
        later load keeps them."""
        self.config = dataclasses.replace(self.config, threads=threads, lower_priority=lower_priority)
        self._set_cpu_options(threads, lower_priority)

    def set_speculation(self, mode: str) -> None:
        """Speculative decoding's mode (``EngineConfig.speculation``) from the next step on; a later load keeps it."""
        self.config = dataclasses.replace(self.config, speculation=mode)  # checks the mode
        self.speculator.set_mode(mode)

    def switch_model(self, config: EngineConfig, progress: Progress | None = None) -> None:
        """Serve ``config`` from now on. Running requests end with ``finish_reason='abort'``.

        A configuration that is refused up front (bad file, does not fit) leaves the current model serving
        untouched; a load that fails later reloads the previous model. Either way the error is raised.
        """
        resolve_source(config.model)
        fit = estimate(config, reclaimable_bytes=self._held_bytes())
        if not fit.fits:
            raise ModelLoadError(f"this configuration does not fit in memory: {fit.summary()}")
        self.abort_all(error=SWITCHED_MESSAGE)
        previous = self.config
        self._release()
        failure = self._try_load(config, progress)
        if failure is None:
            return
        self._release()  # the half-loaded model goes before the previous one comes back
        restored = self._try_load(previous, None)
        if restored is not None:
            self._release()
            raise EngineError(
                f"switching failed ({failure}) and the previous model could not be loaded again ({restored})"
            )
        raise failure

    def unload(self, reason: str) -> list[RequestOutput]:
        """End every live request with ``reason`` as its error and give the model's memory back (the engine then
        has no model); returns the requests' final outputs."""
        self.abort_all(error=reason)
        reported, self._pending = self._pending, []
        self._release()
        return reported

    def close(self) -> None:
        """Finish writing the prefix cache's blocks to disk (bounded); the engine still serves afterwards, without
        its disk tier. Called when an engine goes away: the app's and ``kvasir serve``'s engine thread at its
        end, every engine at interpreter exit."""
        if getattr(self, "disk", None) is not None:
            self.disk.close()
            self.disk = None
            if getattr(self, "scheduler", None) is not None:
                self.scheduler.disk = None

    def _kv_memory_bytes(self) -> int:
        """The pool's tensors: the serving model's, and a draft model's beside them."""
        return self.kv_cache.memory_bytes + (self.draft.kv_cache.memory_bytes if self.draft else 0)

    def _kv_touched_bytes(self) -> int:
        """The pool's memory in use by the system: every block on a GPU, the blocks ever written on the CPU."""
        if self.device.type != "cpu":
            return self._kv_memory_bytes()
        per_token = self.kv_cache.shape.bytes_per_token() + (
            self.draft.kv_cache.shape.bytes_per_token() if self.draft else 0)
        return self.block_manager.num_touched * self.block_size * per_token

    def _disk_stats(self) -> DiskCacheStats | None:
        tier = self.disk
        if tier is None:
            return None
        return DiskCacheStats(tier.hit_tokens_total, tier.blocks_written_total, tier.blocks_dropped_total,
                              tier.store.total_bytes, tier.store.max_bytes, tier.failure or "")

    def clear_disk_cache(self) -> int:
        """Delete this model's KV blocks on disk (waiting for the writes under way); returns the bytes freed."""
        return self.disk.clear() if self.disk is not None else 0

    @property
    def has_model(self) -> bool:
        """False only after a failed switch could not bring the previous model back."""
        return self.loaded is not None

    def _try_load(self, config: EngineConfig, progress: Progress | None) -> Exception | None:
        """Load ``config``; on failure return the error, without the frames that would keep the half-loaded
        model alive."""
        try:
            self._load(config, progress)
        except Exception as exc:
            log.exception("loading %s failed", config.model)
            return _without_frames(exc)
        return None

    def estimate(self, config: EngineConfig) -> FitEstimate:
        """Weight bytes, KV bytes per token and the context that fit for ``config``, before loading it."""
        return estimate(config)

    def _held_bytes(self) -> int:
        draft = self.draft.memory_bytes if self.draft else 0
        return self.loaded.memory_bytes + self.kv_cache.memory_bytes + draft + self._graph_memory_bytes()

    def _graph_memory_bytes(self) -> int:
        runners = (self.runner, self.draft.runner if self.draft is not None else None)
        return sum(r.graphs.memory_bytes for r in runners if r is not None and r.graphs is not None)

    def _graphs_reason(self) -> str:
        graphs = self.runner.graphs
        if graphs is None:
            return self.graphs_problem or "the model's decoder is not the lean one"
        return graphs.problem or ""

    def _release(self) -> None:
        """Drop the model and its KV cache so their memory goes back before the next load; the captured graphs
        go first, since they point into both."""
        if getattr(self, "runner", None) is not None:
            self.runner.close()
        if getattr(self, "draft", None) is not None:
            self.draft.close()
        self.close()
        for name in ("runner", "draft", "scheduler", "block_manager", "kv_cache", "loaded", "tokenizer", "prompts",
                     "disk"):
            setattr(self, name, None)
        gc.collect()
        return_freed_memory()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def abort_all(self, reason: str = "abort", error: str | None = None) -> None:
        """End every live request (reported by the next step)."""
        for seq in list(self._sequences.values()):
            if not seq.finished:
                self._finish(seq, reason, error)

    def has_unfinished(self) -> bool:
        return bool(self._pending) or self.scheduler.has_unfinished()

    def generate(
        self, prompts: Iterable[Prompt], sampling: SamplingParams | list[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """Run ``prompts`` to completion together; the final output of each, in input order."""
        prompts = list(prompts)
        params = sampling if isinstance(sampling, list) else [sampling or SamplingParams()] * len(prompts)
        ids = [self.add_request(p, s) for p, s in zip(prompts, params, strict=True)]
        finals: dict[str, RequestOutput] = {}
        while self.has_unfinished():
            for out in self.step():
                if out.finished:
                    finals[out.request_id] = out
        return [finals[i] for i in ids]

    def stats(self) -> EngineStats:
        """A snapshot of the cache, the queues, the counters and the model."""
        counts = self.block_manager.counts()
        prefill_rate, decode_rate = self.counters.rates()
        gaps = self.counters.token_gaps()
        return EngineStats(
            block_size=self.block_size,
            kv_blocks_total=counts.total,
            kv_blocks_used=counts.used,
            kv_blocks_cached=counts.cached,
            kv_blocks_free=counts.free,
            kv_blocks_shared=counts.shared,
            kv_usage=counts.used / counts.total,
            prefix_hit_rate=self.counters.prefix_hit_rate(),
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            num_preempted_total=self.scheduler.num_preempted_total,
            prompt_tokens_total=self.counters.prompt_tokens_total,
            cached_prompt_tokens_total=self.counters.cached_prompt_tokens_total,
            generated_tokens_total=self.counters.generated_tokens_total,
            prefill_tokens_per_s=prefill_rate,
            decode_tokens_per_s=decode_rate,
            device=str(self.device),
            device_reason=self.device_reason,
            dtype=str(self.loaded.dtype).removeprefix("torch."),
            quantization=self.loaded.quantization,
            attention_backend=self.runner.backend,
            attention_reason=self.runner.fallback_reason or self.attention_reason,
            model_name=self.loaded.source.name,
            model_memory_bytes=self.loaded.memory_bytes + (self.draft.loaded.memory_bytes if self.draft else 0),
            peak_load_bytes=self.loaded.peak_load_bytes,
            warnings=tuple(self.loaded.warnings),
            requests=tuple(self._snapshot(seq) for seq in self._sequences.values()),
            kv_cache_memory_bytes=self._kv_memory_bytes(),
            kv_cache_dtype=self.kv_format.name,
            kv_cache_dtype_reason=self.kv_format_reason,
            disk_cache=self._disk_stats(),
            process_resident_bytes=resident_bytes(),
            kv_touched_bytes=self._kv_touched_bytes(),
            speculation=self.speculator.stats(self.draft.memory_bytes if self.draft else 0),
            max_model_len=self.max_model_len,
            num_errors_total=self.counters.errors_total,
            queue_time_p50_s=self.counters.queue_time_p50(),
            first_tokens=self.counters.first_tokens(),
            gpu=self.gpu_monitor.read(),
            cuda_graphs=self.runner.graphs.num_graphs if self.runner.graphs is not None else 0,
            cuda_graphs_reason=self._graphs_reason(),
            cuda_graph_memory_bytes=self._graph_memory_bytes(),
            inter_token_p99_s=gaps[0],
            inter_token_max_s=gaps[1],
            cpu=self._cpu_usage(),
            reasoning_markers=str(self.reasoning.markers or ""),
            thinking_switch=self.reasoning.can_turn_off,
            reasoning_note=self.reasoning.note,
        )

    def _cpu_usage(self) -> CpuUsage | None:
        if self.device.type != "cpu":
            return None
        state = self.governor.state()
        seen = state.contention_seen_at
        return CpuUsage(threads=state.threads, cores=state.cores, threads_fixed=state.fixed,
                        others_cores=state.others_cores,
                        contention_seen_s_ago=None if seen is None else max(0.0, time.monotonic() - seen),
                        lower_priority=self.config.lower_priority, note=self.priority_note)

    def _snapshot(self, seq: Sequence) -> RequestSnapshot:
        blocks = self.block_manager.blocks
        metrics = RequestMetrics.of(seq)
        return RequestSnapshot(
            request_id=seq.request_id,
            running=seq.status is Status.RUNNING,
            prompt_tokens=seq.num_prompt_tokens,
            cached_prompt_tokens=seq.num_cached_prompt_tokens or 0,
            output_tokens=seq.num_output_tokens,
            queue_time_s=metrics.queue_time_s,
            decode_tokens_per_s=metrics.decode_tokens_per_s,
            blocks=len(seq.block_table),
            exclusive_blocks=sum(1 for b in seq.block_table if blocks[b].ref_count == 1),
            ttft_s=metrics.ttft_s,
            source=seq.source,
        )

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt: raw text, token ids, or chat messages (with the generation prompt).

        Anything else, text that is not valid Unicode or longer than the context holds, or a chat the model's
        template refuses, raises ``ValueError`` saying what is wrong. Safe to call from any thread (see
        :class:`PromptEncoder`); :class:`AsyncEngine` calls it before a request reaches the engine thread.
        """
        return self.prompts.encode(prompt)

    # -- internals ----------------------------------------------------------------------------------

    def _set_cpu_options(self, threads: int | None, lower_priority: bool) -> None:
        self.governor = ThreadGovernor(CPU_THREADS, threads)
        torch.set_num_threads(self.governor.threads)
        self.priority_note = priority.apply(lower_priority)

    def _adapt_threads(self) -> None:
        """Between steps on the CPU: as many threads as other processes leave cores for (see ``cpu_share``)."""
        if self.device.type != "cpu":
            return
        changed = self.governor.tick()
        if changed is not None:
            log.info("%s: the steps now use %d of %d threads", self.loaded.source.name, changed, CPU_THREADS)
            torch.set_num_threads(changed)

    def _plan_attention(self) -> AttentionPlan:
        """The KV cache's format, then the attention backend for this model on this device, why, and its block
        size (one rule each with the fit estimate: :func:`kv_format_for`, :func:`plan_attention`)."""
        source = resolve_source(self.config.model)
        head_dim = read_model_info(source).head_dim
        dtype = resolve_dtype(self.config.dtype, self.device)
        quantization = resolve_quantization(self.config.quantization, self.device, source, dtype)
        self.kv_format, self.kv_format_reason = kv_verdicts.kv_format_for(
            self.config.kv_cache_dtype, source, quantization, head_dim, self.device, dtype)
        return attention_plan.plan_attention(self.config, self.device, head_dim, dtype, self.kv_format)

    def _num_kv_blocks(self, shape: KVShape, draft_bytes_per_token: int = 0) -> int:
        """The cache's size by the one rule (:func:`kv_cache_blocks`); on a GPU from the memory left once a
        measured largest step has its room (see :mod:`.warmup`). A draft model's KV takes its share of every
        block too (``draft_bytes_per_token``)."""
        free = available_memory(self.device)
        sized_by_hand = self.config.num_kv_blocks is not None or self.config.kv_cache_memory is not None
        if self.device.type == "cuda" and not sized_by_hand:
            tokens = min(self.config.max_num_batched_tokens, self.max_model_len)
            self.step_peak_bytes = step_peak_bytes(self.loaded.model, shape, self.block_size, self.device,
                                                   self.attention_backend, tokens)
            free = max(0, available_memory(self.device) - self.step_peak_bytes)
        return kv_cache_blocks(self.config, self.device, shape.bytes_per_token() + draft_bytes_per_token,
                               self.max_model_len, free,
                               self.block_size)

    def _why_it_cannot_fit(self, seq: Sequence) -> str | None:
        if seq.num_prompt_tokens == 0:
            return "the prompt is empty"
        needed = seq.num_prompt_tokens + seq.params.max_tokens
        if needed > self.max_model_len:
            return (
                f"the prompt ({seq.num_prompt_tokens} tokens) plus max_tokens ({seq.params.max_tokens}) is "
                f"{needed} tokens, more than the model's context of {self.max_model_len}"
            )
        pool = self.kv_cache.num_blocks * self.block_size
        if needed > pool:
            return f"the request needs {needed} tokens of KV cache but the whole pool holds {pool}"
        return None

    def _schedule(self) -> SchedulerOutput:
        """This step's chunks; requests whose blocks could not be allocated end here with an error."""
        try:
            scheduled = self.scheduler.schedule()
        except Exception as exc:  # the scheduler's state can't be trusted any more: start it afresh
            log.exception("scheduling failed")
            failed = self.fail_all(f"the engine failed while scheduling: {describe_failure(exc)}")
            self._pending += failed
            return SchedulerOutput()
        for seq, exc in scheduled.failed:
            log.error("allocating KV blocks for %s failed: %r", seq.request_id, exc)
            self._finish(seq, "error", f"the engine could not allocate its KV cache: {describe_failure(exc)}")
        return scheduled

    def _compute(self, scheduled: SchedulerOutput, draft_seconds: float = 0.0, caught_up: CatchUp = CatchUp.NONE
                 ) -> list[RequestOutput]:
        """Run the forward pass for ``scheduled`` and turn its samples into outputs. ``draft_seconds``: what
        writing the step's drafts took, part of the step's cost; ``caught_up``: what they caught up on."""
        start = time.perf_counter()
        for chunk in scheduled.chunks:
            if chunk.seq.first_scheduled_time is None:
                chunk.seq.first_scheduled_time = start
                self.counters.record_admission(chunk.seq.num_prompt_tokens, chunk.seq.num_cached_prompt_tokens or 0,
                                               start - chunk.seq.arrival_time)
        sampled, failed = self._forward(scheduled.chunks)
        end = time.perf_counter()
        for chunk, exc in failed:
            self._finish(chunk.seq, "error", f"the engine failed on this request: {describe_failure(exc)}")
        done = SchedulerOutput([c for c in scheduled.chunks if not c.seq.finished])
        registered = self.scheduler.commit(done)
        if self.draft is not None:
            self.draft.after_step(done.chunks, self.block_manager)
        if self.disk is not None:
            self.disk.save(registered)
        prompt = [(c.start, c.num_tokens) for c in done.chunks if not c.is_decode]
        self.speculator.record(done.chunks, end - start, not prompt and not failed, draft_seconds, caught_up)
        outputs = self._append_tokens(done, sampled, end)
        self.counters.record_step(start, end, sum(n for _, n in prompt), sum(len(tokens) for tokens in sampled))
        if not failed:
            decode_rows = sum(c.num_tokens for c in scheduled.chunks if c.is_decode)
            self.pacer.observe(decode_rows, prompt, end - start)
        return outputs

    def _forward(self, chunks: list[Chunk]) -> tuple[list[list[int]], list[tuple[Chunk, Exception]]]:
        """New tokens of the chunks that succeeded, and the chunks that failed with their exception.

        When the batch fails as a whole, each chunk runs alone, so one request's fault (or an out-of-memory
        on the batch) fails only the request that cannot run. Re-running rewrites the same KV slots.
        """
        try:
            return self.runner.run(chunks), []
        except Exception as exc:
            if len(chunks) == 1:
                log.error("step failed for %s: %r", chunks[0].seq.request_id, exc)
                return [], [(chunks[0], exc)]
            log.warning("a step of %d requests failed (%r); running them one at a time", len(chunks), exc)
        self._free_device_cache()
        sampled, failed = [], []
        for chunk in chunks:
            try:
                sampled += self.runner.run([chunk])
            except Exception as exc:
                log.error("step failed for %s: %r", chunk.seq.request_id, exc)
                failed.append((chunk, exc))
        return sampled, failed

    def _free_device_cache(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _append_tokens(self, scheduled: SchedulerOutput, sampled: list[list[int]], now: float) -> list[RequestOutput]:
        outputs = []
        sampling_chunks = (c for c in scheduled.chunks if c.samples)
        for chunk, tokens in zip(sampling_chunks, sampled, strict=True):
            try:
                outputs.append(self._append_run(chunk.seq, tokens, now))
            except Exception as exc:  # detokenising one reply must not stop the others
                log.exception("handling a token of %s failed", chunk.seq.request_id)
                message = f"the engine failed on this request: {describe_failure(exc)}"
                outputs.append(self._finish(chunk.seq, "error", message, report=False))
        return outputs

    def _append_run(self, seq: Sequence, tokens: list[int], now: float) -> RequestOutput:
        """Add a step's new tokens to ``seq`` (several where a draft was kept), one at a time, so a stop token,
        a stop string or ``max_tokens`` inside the run ends the reply exactly where it would have without one."""
        if seq.first_token_time is None:
            seq.first_token_time = now
            self.counters.record_first_token(now - seq.arrival_time, seq.first_scheduled_time - seq.arrival_time)
        else:
            self.counters.record_token_gap(now, now - seq.last_token_time)
        seq.last_token_time = now
        detok = self._detokenizers[seq.request_id]
        kept = len(tokens) - 1  # a run is the kept draft tokens, then the model's own next token
        for count, token in enumerate(tokens, start=1):
            seq.token_ids.append(token)
            before = len(detok.text)
            reason = self._finish_reason(seq, token, detok)
            if count <= kept:
                seq.mark_kept_draft(before, len(detok.text))
            if reason:
                return self._finish(seq, reason, seq.error, report=False, new_tokens=tokens[:count])
        return self._output(seq, tokens, detok.release())

    def _finish_reason(self, seq: Sequence, token: int, detok: IncrementalDetokenizer) -> str | None:
        params = seq.params
        if seq.constraint is not None and not seq.constraint.accept(token):
            seq.error = f"the reply left its required form: {seq.constraint.error or 'a token it does not allow'}"
            return "error"
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.loaded.eos_token_ids):
            return "stop"
        detok.add(token)
        if detok.stopped or (seq.constraint is not None and seq.constraint.done):
            return "stop"
        if seq.num_output_tokens >= params.max_tokens:
            return "length"
        return None

    def _finish(self, seq: Sequence, reason: str, error: str | None, report: bool = True,
                new_tokens: list[int] | None = None) -> RequestOutput:
        """End ``seq``; ``new_tokens``: the ones this step added, where it ends on them (by default the last
        token, for a stop or a length)."""
        self.scheduler.finish(seq)
        self.speculator.finish(seq.request_id)
        seq.finish_reason, seq.error = reason, error
        if reason == "error":
            self.counters.record_error()
        text, delta = self._text_so_far(seq.request_id, final=True)
        self._detokenizers.pop(seq.request_id, None)
        self._sequences.pop(seq.request_id, None)
        if new_tokens is None:
            new_tokens = [seq.token_ids[-1]] if reason in ("stop", "length") and seq.num_output_tokens else []
        out = self._output(seq, new_tokens, delta, text)
        self._channels.pop(seq.request_id, None)
        if report:
            self._pending.append(out)
        return out

    def _text_so_far(self, request_id: str, final: bool = False) -> tuple[str, str]:
        """The text of a request so far and its newly released part; ``final`` releases everything."""
        detok = self._detokenizers.get(request_id)
        if detok is None:
            return "", ""
        try:
            return detok.text, detok.release(final=final)
        except Exception:  # a broken detokenizer still gives back what was released
            return detok.text[: detok.released], ""

    def _output(self, seq: Sequence, delta_ids: list[int], delta_text: str, text: str | None = None) -> RequestOutput:
        """The output of ``seq`` for this step; ``text``: the reply's released text (by default its
        detokenizer's), ``delta_text`` its new part, both split here into answer and reasoning."""
        if text is None:
            detok = self._detokenizers[seq.request_id]
            text = detok.text[: detok.released]
        channels = self._channels.get(seq.request_id) or ReplyChannels(None, False)
        delta_answer, delta_reasoning, delta_calls = channels.update(text, seq.finished)
        if channels.thinking:
            seq.reasoning_tokens = seq.num_output_tokens
        elif channels.reasoning and seq.reasoning_end_time is None:  # its reasoning has just ended
            seq.reasoning_tokens, seq.reasoning_end_time = seq.num_output_tokens, seq.last_token_time
        spans = tuple((start, min(end, len(text))) for start, end in seq.kept_draft_spans if start < len(text))
        return RequestOutput(
            request_id=seq.request_id,
            text=channels.answer,
            token_ids=seq.output_token_ids,
            delta_text=delta_answer,
            delta_token_ids=delta_ids,
            finished=seq.finished,
            finish_reason=seq.finish_reason,
            error=seq.error,
            metrics=RequestMetrics.of(seq),
            kept_draft_spans=channels.answer_spans(spans),
            reasoning=channels.reasoning,
            delta_reasoning=delta_reasoning,
            tool_calls=channels.tool_calls,
            delta_tool_calls=delta_calls,
        )


def _without_frames(exc: BaseException) -> BaseException:
    """``exc`` with the tracebacks of its whole chain dropped (they hold every local of the failed load)."""
    link, seen = exc, set()
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return exc


def describe_failure(exc: BaseException) -> str:
    """A failure in words: out-of-memory said plainly, anything else with its kind and message."""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return "out of memory; try a shorter conversation or fewer replies at once"
    return f"{type(exc).__name__}: {exc}"
