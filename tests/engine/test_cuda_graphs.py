"""CUDA-graph decode steps, run on the CPU with the capture replaced by an eager call of the captured function.

Everything but ``torch.cuda.graph`` itself runs here: the buckets, the static input buffers, the padding rows
and the scratch block, the graph-safe attention (torch and, through the stand-in, flash-attn's paged decode
kernel), the fallbacks, the stats and the release. Greedy tokens must equal the eager engine's (today's path).
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from types import SimpleNamespace

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.step import cuda_graphs
from engine.step.attention import SequenceSlice, build_metadata
from engine.step.cuda_graphs import bucket, graph_batch_sizes, width_buckets
from tests.helpers import eager_graphs, flash_stand_in, sync_counter
from tests.helpers.draft_oracle import with_oracle
from tests.helpers.tiny_models import VOCAB

PROMPTS = [
    "the first chat asks about paged attention",
    "hi",
    "a third conversation, somewhat longer than the second one, about caches and blocks",
    "four",
    "and a fifth, which wants to know about graphs",
]


@pytest.fixture
def graphs(monkeypatch):
    """Graphs on the CPU, captured as eager calls (recorded)."""
    return eager_graphs.install(monkeypatch)


def _engine(folder, **settings) -> Engine:
    """Speculation off unless asked: these tests count the decode steps graphs replay."""
    return Engine(EngineConfig(model=str(folder), quantization="none", dtype="float32", num_kv_blocks=64,
                               **{"speculation": "off", **settings}))


def _params(tokens: list[int]) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in tokens]


# -- the buckets ------------------------------------------------------------------------------------


def test_batch_sizes_are_nano_vllms_and_end_at_max_num_seqs():
    assert graph_batch_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert graph_batch_sizes(20) == [1, 2, 4, 8, 16, 20]
    assert graph_batch_sizes(8) == [1, 2, 4, 8]
    assert graph_batch_sizes(1) == [1]


def test_widths_are_powers_of_two_up_to_the_whole_context():
    assert width_buckets(128) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert width_buckets(100) == [1, 2, 4, 8, 16, 32, 64, 100]
    assert width_buckets(1) == [1]


@pytest.mark.parametrize(("needed", "chosen"), [(1, 1), (3, 4), (5, 8), (9, 16), (17, 32), (49, 64), (64, 64)])
def test_a_batch_is_padded_to_the_nearest_captured_size(needed, chosen):
    assert bucket(graph_batch_sizes(64), needed) == chosen


# -- greedy tokens equal the eager engine's -----------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_graph_decode_matches_the_eager_engine(tiny_model_dirs, arch, graphs):
    """3 chats (padded to 4), then 5 (to 8) that finish at different steps, so the batch shrinks through the
    buckets; the prompts are 1-2 blocks and the replies 40 tokens, so tables cross width buckets mid-reply."""
    folder = tiny_model_dirs[arch]
    graph_engine, eager = _engine(folder), _engine(folder, cuda_graphs=False)
    assert graph_engine.runner.graphs is not None and eager.runner.graphs is None
    for prompts, lengths in ((PROMPTS[:3], [40, 33, 25]), (PROMPTS, [40, 12, 30, 7, 21])):
        want = [out.token_ids for out in eager.generate(prompts, _params(lengths))]
        got = [out.token_ids for out in graph_engine.generate(prompts, _params(lengths))]
        assert got == want
    batches = {batch for batch, _ in graphs["buckets"]}
    widths = {width for _, width in graphs["buckets"]}
    assert {1, 2, 4, 8} <= batches and {2, 4} <= widths, graphs["buckets"]  # shrinking batches, growing tables
    assert eager_graphs.replays(graphs) > 60  # the decode steps replayed; prefill ran eagerly
    stats = graph_engine.stats()
    assert stats.cuda_graphs == len(graphs["captured"]) and stats.cuda_graphs_reason == ""
    assert stats.cuda_graph_memory_bytes >= 64 * VOCAB * 4  # the static float32 logits of the largest batch


def test_graph_decode_with_prefix_cache_hits(tiny_model_dirs, graphs):
    shared = "a shared system prompt that is long enough to fill two whole blocks of the cache, " * 2
    prompts = [shared + "first", shared + "second question", shared + "third"]
    graph_engine, eager = _engine(tiny_model_dirs["llama"]), _engine(tiny_model_dirs["llama"], cuda_graphs=False)
    for engine in (graph_engine, eager):
        engine.generate([prompts[0]], _params([4]))  # fills the cache with the shared prefix
    want = [out.token_ids for out in eager.generate(prompts, _params([20, 18, 16]))]
    got = [out.token_ids for out in graph_engine.generate(prompts, _params([20, 18, 16]))]
    assert got == want
    assert graph_engine.stats().cached_prompt_tokens_total >= 2 * 3 * 16 and eager_graphs.replays(graphs) > 0


def test_a_drafts_check_is_replayed_as_one_row_per_position(tiny_model_dirs, graphs):
    """Speculative decoding's steps through graphs: a chunk with a draft is its positions as decode rows (so one
    chat's step fills a bucket of several rows), and greedy replies stay the plain engine's, token for token."""
    folder = tiny_model_dirs["llama"]
    prompts, lengths = PROMPTS[:2], [40, 30]
    plain = _engine(folder, cuda_graphs=False).generate(prompts, _params(lengths))
    engine = _engine(folder, speculation="ngram")
    oracle = with_oracle(engine, plain, prompts)
    drafted = engine.generate(prompts, _params(lengths))
    assert [o.token_ids for o in drafted] == [o.token_ids for o in plain]
    kept = sum(o.metrics.accepted_draft_tokens for o in drafted)
    assert 0 < kept < oracle.proposed  # drafts kept and rejected
    assert max(batch for batch, _ in graphs["buckets"]) > len(prompts)  # draft rows went through a graph
    assert engine.stats().cuda_graphs_reason == ""


def test_a_draft_models_passes_replay_graphs_of_their_own(tiny_model_dirs, graphs):
    """A draft model's passes replay graphs captured over its own KV tensors, the serving model checks through
    its graphs, and greedy replies stay the plain ones. (The draft is the model itself, unquantised: int4 would
    run on the native CPU kernels here, which graphs do not capture.)"""
    folder = tiny_model_dirs["llama"]
    prompts, lengths = PROMPTS[:3], [30, 24, 18]
    plain = _engine(folder, cuda_graphs=False).generate(prompts, _params(lengths))
    engine = _engine(folder, speculation="draft", draft_model=str(folder), draft_quantization="none")
    drafted = engine.generate(prompts, _params(lengths))
    assert [o.token_ids for o in drafted] == [o.token_ids for o in plain]
    assert sum(o.metrics.accepted_draft_tokens for o in drafted) > 0
    draft_graphs = engine.draft.runner.graphs
    assert draft_graphs is not None and draft_graphs.num_graphs > 0
    assert draft_graphs.kv_cache is engine.draft.kv_cache and engine.runner.graphs.num_graphs > 0
    assert engine.stats().cuda_graph_memory_bytes == engine.runner.graphs.memory_bytes + draft_graphs.memory_bytes


@torch.inference_mode()
def test_the_captured_function_computes_the_lean_decoders_logits(tiny_model_dirs, graphs):
    """The static step, called directly, at a width wider than the rows need and with padding rows."""
    engine = _engine(tiny_model_dirs["qwen3"])
    runner, steps = engine.runner, engine.runner.graphs
    tables, lengths = [[5, 9], [2], [7, 3, 11]], [20, 3, 40]
    ids = torch.tensor(engine.encode_prompt("three rows of one token each"))[:3]
    for table, length in zip(tables, lengths):  # fill each row's earlier keys with what a prefill would write
        prefix = torch.arange(length - 1) % 100 + 10
        runner.lean(prefix, build_metadata(runner.kv_cache, [SequenceSlice(0, 0, length - 1, table)],
                                           runner.device, "torch", torch.float32), torch.tensor([0]))
    slices = [SequenceSlice(i, n - 1, n, t) for i, (t, n) in enumerate(zip(tables, lengths))]
    want = runner.lean(ids, build_metadata(runner.kv_cache, slices, runner.device, "torch", torch.float32),
                       torch.arange(3))
    scratch, batch, width = engine.kv_cache.scratch_block, 4, 8
    rows = [t + [scratch] * (width - len(t)) for t in tables] + [[scratch] * width]
    slots = [t[(n - 1) // 16] * 16 + (n - 1) % 16 for t, n in zip(tables, lengths)] + [scratch * 16]
    inputs = torch.tensor(ids.tolist() + [0] + [n - 1 for n in lengths] + [0] + slots + lengths + [1]
                          + sum(rows, []))
    steps.forward(inputs, batch, width)
    torch.testing.assert_close(steps._logits[:3], want, rtol=0, atol=1e-5)


def test_the_captured_step_neither_waits_nor_builds_on_the_host(tiny_model_dirs, graphs, monkeypatch):
    """What a graph records must run without the host: a wait or a host-built tensor inside it would fail the
    capture (or be frozen into it)."""
    engine = _engine(tiny_model_dirs["qwen3"])
    for prompt in PROMPTS[:3]:
        engine.add_request(prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    while not graphs["captured"]:
        engine.step()
    waits, built = sync_counter.install(monkeypatch), []
    for name in ("tensor", "as_tensor", "from_numpy"):
        original = getattr(torch, name)
        monkeypatch.setattr(torch, name, lambda *a, _original=original, **k: built.append(a) or _original(*a, **k))
    batch = graphs["buckets"][0][0]
    before = engine.runner.graphs._logits[:batch].clone()  # the rows past the batch were never written
    with torch.inference_mode():
        graphs["captured"][0].replay()
    assert waits["n"] == 0 and built == [], (waits, built)
    # the same step again (to rounding: the CPU's matmuls may round differently at other buffer alignments)
    torch.testing.assert_close(engine.runner.graphs._logits[:batch], before, rtol=0, atol=1e-5)


# -- padding rows ---------------------------------------------------------------------------------------


def test_padding_rows_write_only_the_scratch_block(tiny_model_dirs, graphs):
    engine = _engine(tiny_model_dirs["llama"])
    for prompt in PROMPTS[:3]:
        engine.add_request(prompt, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    while not graphs["captured"]:  # prefill (eager), up to the first decode step
        before = [k.clone() for k in engine.kv_cache.keys] + [v.clone() for v in engine.kv_cache.values]
        engine.step()
    cache, size = engine.kv_cache, engine.kv_cache.block_size
    after = cache.keys + cache.values
    changed = set()
    for old, new in zip(before, after):
        blocks, offsets = (old != new).flatten(2).any(-1).nonzero().unbind(1)  # [blocks, block_size] slots
        changed |= set((blocks * size + offsets).tolist())
    real = set()
    for seq in engine._sequences.values():  # each one's last token was computed by that step
        position = len(seq.token_ids) - 2
        real.add(seq.block_table[position // size] * size + position % size)
    scratch = set(range(cache.scratch_block * size, (cache.scratch_block + 1) * size))
    assert len(graphs["buckets"]) == 1 and graphs["buckets"][0][0] == 4 and len(real) == 3
    assert real <= changed and changed - real <= scratch and changed & scratch  # the padding row wrote there


def test_the_scratch_block_is_outside_the_pool(tiny_model_dirs, graphs):
    engine = _engine(tiny_model_dirs["llama"])
    stats = engine.stats()
    assert engine.kv_cache.scratch_block == 64 and engine.kv_cache.keys[0].shape[0] == 65
    assert stats.kv_blocks_total == 64 and engine.block_manager.num_blocks == 64
    assert stats.kv_cache_memory_bytes == 65 * 16 * engine.kv_cache.shape.bytes_per_token()
    eager = _engine(tiny_model_dirs["llama"], cuda_graphs=False)
    assert eager.kv_cache.scratch_block is None and eager.kv_cache.keys[0].shape[0] == 64


# -- the switch, the stats, the fallbacks ------------------------------------------------------------


def test_off_means_todays_path(tiny_model_dirs, graphs):
    engine = _engine(tiny_model_dirs["llama"], cuda_graphs=False)
    engine.generate(PROMPTS[:3], _params([6, 6, 6]))
    stats = engine.stats()
    assert engine.runner.graphs is None and graphs["captured"] == []
    assert stats.cuda_graphs == 0 and "turned off" in stats.cuda_graphs_reason


def test_on_the_cpu_graphs_say_why_not(tiny_model_dirs):
    engine = _engine(tiny_model_dirs["llama"])
    assert engine.runner.graphs is None and engine.stats().cuda_graphs_reason == "not on the CPU"


def test_transformers_modules_are_not_captured(tiny_model_dirs, graphs):
    engine = _engine(tiny_model_dirs["phi3"])
    assert engine.runner.graphs is None and "phi3" in engine.stats().cuda_graphs_reason


def test_rotary_scalings_that_read_positions_on_the_host_are_not_captured(tiny_model_dirs):
    model = _engine(tiny_model_dirs["llama"]).loaded.model
    assert cuda_graphs.graphs_problem(True, torch.device("cuda"), model) is None
    model.model.rotary_emb.rope_type = "dynamic"
    assert "dynamic rotary scaling" in cuda_graphs.graphs_problem(True, torch.device("cuda"), model)


def test_flex_decode_steps_are_not_replayed_through_the_torch_paths_graphs(tiny_model_dirs):
    """A graph holds the torch path's (or flash-attn's) decode attention: replaying it for a flex engine would
    run, and measure, the torch kernel under the flex name."""
    model = _engine(tiny_model_dirs["llama"]).loaded.model
    problem = cuda_graphs.graphs_problem(True, torch.device("cuda"), model, "flex")
    assert problem is not None and "FlexAttention" in problem
    assert cuda_graphs.graphs_problem(True, torch.device("cuda"), model, "flash_attn") is None


def test_bitsandbytes_int8_with_outliers_is_refused_before_any_capture(tiny_model_dirs):
    """LLM.int8()'s outlier path reads back to the host in every layer: graphs are off up front, with the
    reason, not after a failed capture; without the threshold the layers are capturable."""
    from engine.step.quantization import import_bitsandbytes

    bnb = import_bitsandbytes()
    model = _engine(tiny_model_dirs["llama"]).loaded.model
    layer = model.model.layers[0].mlp
    layer.down_proj = bnb.nn.Linear8bitLt(128, 64, bias=False, has_fp16_weights=False, threshold=6.0)
    problem = cuda_graphs.graphs_problem(True, torch.device("cuda"), model)
    assert problem is not None and "outlier threshold (6)" in problem
    layer.down_proj = bnb.nn.Linear8bitLt(128, 64, bias=False, has_fp16_weights=False, threshold=0.0)
    assert cuda_graphs.graphs_problem(True, torch.device("cuda"), model) is None


def test_captures_and_replays_run_with_the_engines_device_current(tiny_model_dirs, graphs, monkeypatch):
    """On cuda:N a capture with another device current records an empty graph; every capture and replay must
    happen inside the engine's device scope, and the capture is told the device its streams go on."""
    current, seen = [], {"captures": [], "replays": []}

    @contextlib.contextmanager
    def scope(device):
        current.append(device)
        try:
            yield
        finally:
            current.pop()

    monkeypatch.setattr(cuda_graphs, "device_scope", scope)
    capture, replay = cuda_graphs.capture_graph, eager_graphs.EagerGraph.replay
    monkeypatch.setattr(cuda_graphs, "capture_graph",
                        lambda forward, pool, device: seen["captures"].append((list(current), device))
                        or capture(forward, pool, device))
    monkeypatch.setattr(eager_graphs.EagerGraph, "replay",
                        lambda graph: seen["replays"].append(list(current)) or replay(graph))
    engine = _engine(tiny_model_dirs["llama"])
    engine.generate(PROMPTS[:3], _params([6, 6, 6]))
    assert seen["captures"] and seen["replays"]
    assert all(scopes == [engine.device] and device == engine.device for scopes, device in seen["captures"])
    assert all(scopes == [engine.device] for scopes in seen["replays"])


def test_the_capture_makes_its_streams_on_the_engines_device(monkeypatch):
    """``torch.cuda.graph``'s default stream is made once on whichever device was current: the capture passes
    its own, made on the engine's device, as it does the warm-up's side stream."""
    made, graph_calls, runs = [], [], []

    class FakeStream:
        def __init__(self, device=None):
            made.append(device)

        def wait_stream(self, other):
            pass

    class FakeGraph:
        def pool(self):
            return "the pool"

    def fake_graph(graph, pool=None, stream=None, capture_error_mode="global"):
        graph_calls.append((pool, stream, capture_error_mode))
        return contextlib.nullcontext()

    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream(device))
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", fake_graph)
    second = torch.device("cuda:1")
    graph, pool = cuda_graphs.capture_graph(lambda: runs.append(1), "old pool", second)
    assert runs == [1, 1] and pool == "the pool" and isinstance(graph, FakeGraph)
    assert made == [second] * 3  # the side stream, the current one asked of cuda:1, the capture stream
    [(pool_given, stream, mode)] = graph_calls
    assert pool_given == "old pool" and isinstance(stream, FakeStream) and mode == "thread_local"


def test_graph_memory_counts_the_pool_that_the_capture_empties_the_cache_for(tiny_model_dirs, graphs, monkeypatch):
    """``torch.cuda.graph`` empties the allocator's cache before recording: a reading taken before that counts
    the cache as held and the pool's growth as none."""
    allocator = {"cached": 100 << 20, "pool": 0}
    monkeypatch.setattr(cuda_graphs, "_reserved_bytes", lambda device: allocator["cached"] + allocator["pool"])
    monkeypatch.setattr(cuda_graphs, "_empty_cache", lambda device: allocator.update(cached=0))
    capture = cuda_graphs.capture_graph

    def capture_growing_the_pool(forward, pool, device):
        allocator.update(cached=0, pool=allocator["pool"] + (3 << 20))  # emptied, then the graph's pool grows
        return capture(forward, pool, device)

    monkeypatch.setattr(cuda_graphs, "capture_graph", capture_growing_the_pool)
    engine = _engine(tiny_model_dirs["llama"])
    engine.generate(PROMPTS[:3], _params([6, 6, 6]))
    steps = engine.runner.graphs
    static = steps._static_bytes + sum(entry.inputs.nbytes for entry in steps._graphs.values())
    assert steps.num_graphs >= 1 and steps.memory_bytes - static == steps.num_graphs * (3 << 20)


def test_the_setting_is_validated():
    with pytest.raises(ValueError, match="cuda_graphs"):
        EngineConfig(cuda_graphs="yes")


@pytest.mark.parametrize("command", [["generate", "hi"], ["chat"], ["serve"], ["bench"]])
def test_the_command_line_turns_graphs_off(command, monkeypatch, tmp_path):
    from engine.tools.cli import build_parser, config_from

    monkeypatch.setenv("KVASIR_DATA_DIR", str(tmp_path))  # an empty model library
    parser = build_parser()
    assert config_from(parser.parse_args(command)).cuda_graphs is True
    assert config_from(parser.parse_args(command[:1] + ["--no-cuda-graphs"] + command[1:])).cuda_graphs is False


def test_a_failed_capture_falls_back_to_eager_steps(tiny_model_dirs, graphs, monkeypatch):
    def refuse(forward, pool, device):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(cuda_graphs, "capture_graph", refuse)
    engine, eager = _engine(tiny_model_dirs["llama"]), _engine(tiny_model_dirs["llama"], cuda_graphs=False)
    params = _params([10, 10, 10])
    assert [o.token_ids for o in engine.generate(PROMPTS[:3], params)] == [
        o.token_ids for o in eager.generate(PROMPTS[:3], params)]
    stats = engine.stats()
    assert stats.cuda_graphs == 0 and "capturing a decode step failed (RuntimeError" in stats.cuda_graphs_reason


def test_past_the_graph_cap_steps_run_eagerly(tiny_model_dirs, graphs):
    engine, eager = _engine(tiny_model_dirs["llama"]), _engine(tiny_model_dirs["llama"], cuda_graphs=False)
    engine.runner.graphs.max_graphs = 1
    params = _params([30, 5, 18])
    assert [o.token_ids for o in engine.generate(PROMPTS[:3], params)] == [
        o.token_ids for o in eager.generate(PROMPTS[:3], params)]
    assert len(graphs["captured"]) == 1 and engine.stats().cuda_graphs == 1


def test_graphs_need_the_scratch_block(tiny_model_dirs):
    engine = _engine(tiny_model_dirs["llama"])  # on the CPU: no graphs, so no scratch block reserved
    limits = cuda_graphs.GraphLimits(max_num_seqs=4, max_model_len=64)
    with pytest.raises(ValueError, match="scratch block"):
        cuda_graphs.DecodeGraphs(engine.runner.lean, engine.kv_cache, engine.device, False, limits)


def test_a_step_past_the_buckets_context_runs_eagerly(tiny_model_dirs, graphs):
    engine = _engine(tiny_model_dirs["llama"], max_model_len=64)
    steps = engine.runner.graphs
    assert steps.widths == [1, 2, 4]
    engine.generate(["hi"], _params([3]))
    seq = SimpleNamespace(token_ids=list(range(70)), block_table=list(range(5)))
    assert steps.run([SimpleNamespace(seq=seq, start=69, end=70, draft=[])]) is None and steps.num_graphs == 1


# -- release ----------------------------------------------------------------------------------------------


def test_close_drops_every_graph(tiny_model_dirs, graphs):
    engine = _engine(tiny_model_dirs["llama"])
    engine.generate(PROMPTS[:3], _params([20, 20, 20]))
    alive = [weakref.ref(graph) for graph in graphs["captured"]]
    graphs["captured"].clear()
    assert alive and all(ref() is not None for ref in alive)
    steps = engine.runner.graphs
    engine.runner.close()
    gc.collect()
    assert engine.runner.graphs is None and all(ref() is None for ref in alive)
    assert steps.num_graphs == 0 and steps.memory_bytes == 0 and engine.stats().cuda_graph_memory_bytes == 0
    assert steps.problem == "released" and steps._logits is None  # nothing replays, the static buffers are gone


def test_switching_releases_the_graphs_before_the_model(tiny_model_dirs, graphs):
    engine = _engine(tiny_model_dirs["llama"])
    engine.generate(PROMPTS[:2], _params([6, 6]))
    steps, seen = engine.runner.graphs, []
    close = steps.close

    def recording_close():
        seen.append(engine.loaded is not None and engine.kv_cache is not None)
        close()

    steps.close = recording_close
    engine.switch_model(EngineConfig(model=str(tiny_model_dirs["qwen3"]), quantization="none", dtype="float32",
                                     num_kv_blocks=64))
    assert seen == [True] and steps._graphs == {}
    assert engine.runner.graphs is not None and engine.stats().cuda_graphs == 0  # the new model's, none yet


# -- flash-attn's paged decode kernel, through the stand-in ----------------------------------------------


@pytest.fixture
def flash(monkeypatch):
    return flash_stand_in.install(monkeypatch)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_flash_graph_decode_matches_the_torch_path(tiny_model_dirs, arch, graphs, flash):
    folder = tiny_model_dirs[arch]
    graph_engine = _engine(folder)
    assert graph_engine.block_size == 256 and graph_engine.runner.graphs.flash
    plain = _engine(folder, attention_backend="torch", block_size=256, cuda_graphs=False)
    params = _params([24, 16, 20, 9, 12])
    want = [out.token_ids for out in plain.generate(PROMPTS, params)]
    got = [out.token_ids for out in graph_engine.generate(PROMPTS, params)]
    assert got == want
    stats = graph_engine.stats()
    # captured (a host read under the capture would have turned graphs off) and replayed, through the varlen kernel
    assert stats.cuda_graphs == len(graphs["captured"]) > 0 and stats.cuda_graphs_reason == ""
    assert eager_graphs.replays(graphs) > 0 and flash.kvcache_calls == 0
    assert {width for _, width in graphs["buckets"]} == {8}  # 2048 / 256: one width


def test_the_kvcache_stand_in_reads_the_host_as_flash_attn_after_2_8_3_does(monkeypatch):
    """Why the graphs use the varlen kernel: ``flash_attn_with_kvcache`` reads ``cache_seqlens.max()`` back in
    its wrapper, which a capture refuses; the varlen kernel, given its maxima, reads nothing back."""
    eager_graphs.refuse_host_reads(monkeypatch)
    module = flash_stand_in.make_module()
    q = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16)
    cache = torch.randn(3, 256, 2, 64, dtype=torch.bfloat16)
    lengths = torch.tensor([10, 300], dtype=torch.int32)
    table = torch.tensor([[0, 2], [1, 2]], dtype=torch.int32)
    with eager_graphs.simulated_capture(), pytest.raises(eager_graphs.HostReadDuringCapture, match="item"):
        module.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=lengths, block_table=table, causal=True)
    cu_q, cu_k = torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([0, 10, 310], dtype=torch.int32)
    with eager_graphs.simulated_capture():
        out = module.flash_attn_varlen_func(q[:, 0], cache, cache, cu_q, cu_k, 1, 512, causal=True, block_table=table)
    want = module.flash_attn_with_kvcache(q, cache, cache, cache_seqlens=lengths, block_table=table, causal=True)
    torch.testing.assert_close(out, want[:, 0])


def test_kvcache_stand_in_refuses_what_flash_attn_refuses():
    attend = flash_stand_in.make_module().flash_attn_with_kvcache
    q = torch.randn(2, 1, 4, 64, dtype=torch.bfloat16)
    cache = torch.randn(3, 256, 2, 64, dtype=torch.bfloat16)
    lengths = torch.tensor([10, 300], dtype=torch.int32)
    table = torch.tensor([[0, 2], [1, 2]], dtype=torch.int32)
    base = dict(q=q, k_cache=cache, v_cache=cache, cache_seqlens=lengths, block_table=table, causal=True)
    assert attend(**base).shape == q.shape
    cases = [
        (dict(q=q.float()), "fp16 and bf16"),
        (dict(k_cache=cache.float(), v_cache=cache.float()), "same dtype"),
        (dict(block_table=table.long()), "int32"),
        (dict(cache_seqlens=lengths.long()), "int32"),
        (dict(cache_seqlens=torch.tensor([10], dtype=torch.int32)), "one length per batch row"),
        (dict(k_cache=cache[:, :16].contiguous(), v_cache=cache[:, :16].contiguous()), "divisible by 256"),
        (dict(q=torch.randn(2, 1, 3, 64, dtype=torch.bfloat16)), "divide number of heads"),
        (dict(q=q[0]), r"\[batch, seqlen_q, heads, D\]"),
        (dict(cache_batch_idx=torch.tensor([0, 1], dtype=torch.int32)), "cache_batch_idx"),
        (dict(cache_seqlens=torch.tensor([10, 600], dtype=torch.int32)), "longer than its block table"),
    ]
    for change, said in cases:
        with pytest.raises(RuntimeError, match=said):
            attend(**{**base, **change})
    with pytest.raises(AssertionError, match="contiguous last dimension"):
        attend(**{**base, "k_cache": cache.transpose(2, 3)})
