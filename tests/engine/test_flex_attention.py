"""The FlexAttention backend: paged attention that reads the KV pool in place through a block mask.

On the CPU it runs uncompiled, which computes every query's scores against every key of the pool's used
prefix (``torch/_higher_order_ops/flex_attention.py``: ``math_attention``), so these tests keep their pools small.
"""

import types

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.serving.kv_cache import KVCache, KVShape
from engine.step import attention, flex_attention
from engine.step.attention import SequenceSlice, build_metadata, paged_attention
from engine.step.attention_backend import choose_backend
from engine.step.flex_attention import build_flex_metadata, flex_problem
from tests.engine.test_step_syncs import sync_counter  # noqa: F401  (a fixture)

HEADS, KV_HEADS, DIM, BS = 4, 2, 8, 4
CPU = torch.device("cpu")
GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)


# -- one layer against attention computed by hand ---------------------------------------------------


def by_hand(q, k, v):
    """Each query ``i`` of the last ``len(q)`` positions: softmax over the sequence's keys ``0 .. L - n + i``."""
    groups = HEADS // KV_HEADS
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)  # [L, H, D]
    offset = k.shape[0] - q.shape[0]
    out = torch.empty_like(q)
    for i in range(q.shape[0]):
        visible = offset + i + 1
        scores = torch.einsum("hd,lhd->hl", q[i], k[:visible]) / DIM**0.5
        out[i] = torch.einsum("hl,lhd->hd", scores.softmax(-1), v[:visible])
    return out


def fill(cache, table, keys, values, count):
    for pos in range(count):
        slot = table[pos // BS] * BS + pos % BS
        cache.flat_keys[0][slot], cache.flat_values[0][slot] = keys[pos], values[pos]


# (cached tokens, new tokens, block table): decodes and prefill chunks, tables out of order and sharing none
STEP = [(6, 1, [5, 2]), (3, 7, [9, 4, 7]), (0, 5, [1, 11]), (13, 1, [12, 0, 8, 3]), (4, 1, [10, 6])]


def run_layer(compiled):
    torch.manual_seed(0)
    cache = KVCache(KVShape(1, KV_HEADS, DIM, torch.float32), 14, BS, CPU)
    slices, queries, new_k, new_v, sequences = [], [], [], [], []
    offset = 0
    for cached, new, table in STEP:
        keys, values = torch.randn(cached + new, KV_HEADS, DIM), torch.randn(cached + new, KV_HEADS, DIM)
        fill(cache, table, keys, values, cached)
        slices.append(SequenceSlice(offset, cached, cached + new, table))
        queries.append(torch.randn(new, HEADS, DIM))
        new_k.append(keys[cached:])
        new_v.append(values[cached:])
        sequences.append((keys, values))
        offset += new
    meta = build_metadata(cache, slices, CPU, "flex", torch.float32)
    meta.flex = build_flex_metadata(slices, BS, cache.num_blocks, CPU, compiled=compiled)
    q = torch.cat(queries)
    out, _ = paged_attention(types.SimpleNamespace(layer_idx=0), q.transpose(0, 1)[None],
                             torch.cat(new_k).transpose(0, 1)[None], torch.cat(new_v).transpose(0, 1)[None], None,
                             kvasir=meta)
    return out[0], meta, slices, queries, sequences


def assert_matches_by_hand(out, slices, queries, sequences):
    for s, q, (keys, values) in zip(slices, queries, sequences):
        got, want = out[s.offset : s.offset + s.end - s.start], by_hand(q, keys, values)
        assert torch.allclose(got, want, atol=1e-5), (s, (got - want).abs().max())


def test_one_layer_matches_attention_by_hand():
    out, meta, slices, queries, sequences = run_layer(compiled=False)
    assert meta.flex.decode is not None and meta.flex.prefill is not None and meta.decode is None
    assert_matches_by_hand(out, slices, queries, sequences)


def test_the_comparison_catches_a_wrong_logical_map(monkeypatch):
    """The check above can fail: with every block mapped to logical block 0, keys are hidden or misplaced."""
    def all_first(tables, num_blocks, device):
        return torch.zeros(num_blocks + 1, dtype=torch.int32)

    monkeypatch.setattr(flex_attention, "_logical_positions", all_first)
    out, _, slices, queries, sequences = run_layer(compiled=False)
    wrong = [not torch.allclose(out[s.offset : s.offset + s.end - s.start], by_hand(q, k, v), atol=1e-3)
             for s, q, (k, v) in zip(slices, queries, sequences)]
    assert wrong == [True, True, True, True, True]


def test_block_mask_rows_are_the_block_tables():
    _, meta, slices, _, _ = run_layer(compiled=False)
    decode, prefill = meta.flex.decode, meta.flex.prefill
    tables = {i: s.block_table[: -(-s.end // BS)] for i, s in enumerate(slices)}
    mask = decode.block_mask
    for row, i in enumerate([0, 3, 4]):  # the decoding sequences, in step order
        full = mask.full_kv_indices[row, 0, 0, : mask.full_kv_num_blocks[row, 0, 0]].tolist()
        partial = mask.kv_indices[row, 0, 0, : mask.kv_num_blocks[row, 0, 0]].tolist()
        assert full + partial == tables[i]
        assert partial == tables[i][-1:] or not partial  # only the last block needs the mask evaluated
    mask = prefill.block_mask
    query_block = flex_attention.EAGER_QUERY_BLOCK
    row = 0
    for i in (1, 2):  # the prefill chunks: each query block visits its sequence's blocks up to its last query
        s = slices[i]
        for first in range(s.start, s.end, query_block):
            last = min(first + query_block, s.end) - 1
            full = mask.full_kv_indices[0, 0, row, : mask.full_kv_num_blocks[0, 0, row]].tolist()
            partial = mask.kv_indices[0, 0, row, : mask.kv_num_blocks[0, 0, row]].tolist()
            assert full + partial == tables[i][: last // BS + 1]
            assert full == tables[i][: (first + 1) // BS]
            row += 1


def test_uncompiled_reads_only_the_used_prefix_of_the_pool_and_compiled_all_of_it():
    slices = [SequenceSlice(0, 5, 6, [3, 1])]
    assert build_flex_metadata(slices, BS, 64, CPU, compiled=False).kv_tokens == 4 * BS
    compiled = build_flex_metadata(slices, BS, 64, CPU, compiled=True)
    assert compiled.kv_tokens == 64 * BS and compiled.decode.block_mask.kv_indices.shape[-1] == 64


def test_compiled_shapes_are_bucketed():
    slices = [SequenceSlice(i, 5, 6, [2 * i, 2 * i + 1]) for i in range(3)]
    meta = build_flex_metadata(slices, BS, 64, CPU, compiled=True)
    assert meta.decode.block_mask.kv_num_blocks.shape[0] == 4  # three sequences padded to four
    assert meta.decode.query_index.tolist() == [0, 1, 2, 0] and meta.decode.count == 3


@pytest.mark.slow
def test_compiled_path_matches_attention_by_hand():
    """The compiled kernels (the CPU's C++ template here; triton on CUDA): about a minute of compiling."""
    out, meta, slices, queries, sequences = run_layer(compiled=True)
    assert meta.flex.compiled
    assert_matches_by_hand(out, slices, queries, sequences)


# -- the engine on the flex backend against the torch path -------------------------------------------


def record_steps(monkeypatch):
    """Every step's sequence slices, as the flex metadata receives them."""
    steps = []
    build = attention.build_flex_metadata

    def recording(slices, *args, **kwargs):
        steps.append([(s.start, s.end, list(s.block_table)) for s in slices])
        return build(slices, *args, **kwargs)

    monkeypatch.setattr(attention, "build_flex_metadata", recording)
    return steps


def workload(engine):
    """Chunked prefill, a prefix hit on blocks that are not consecutive, and chats of different lengths decoding
    together with prefill chunks in the same steps."""
    system = "You are a careful assistant who answers in one short sentence. " * 4
    first = engine.generate([system + "What is a block?"], GREEDY)
    other = engine.generate(["an unrelated request that takes the next free blocks " * 2], GREEDY)
    hit = engine.generate([system + "And what is a page?"], GREEDY)  # the system prompt's blocks, then new ones
    together = engine.generate(["hi", "a middling prompt about caches", system + "Why?", "ok then " * 9], GREEDY)
    return [o.token_ids for o in first + other + hit + together]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_tokens_match_the_torch_path(tiny_model_dirs, arch, monkeypatch):
    settings = dict(model=str(tiny_model_dirs[arch]), quantization="none", dtype="float32", num_kv_blocks=48,
                    block_size=16, max_num_batched_tokens=32)
    flex = Engine(EngineConfig(**settings, attention_backend="flex"))
    assert flex.stats().attention_backend == "flex" and "chosen in the settings" in flex.stats().attention_reason
    steps = record_steps(monkeypatch)
    got = workload(flex)
    assert flex.stats().cached_prompt_tokens_total >= 64
    # the prefix hit: its first chunk starts after the three cached blocks, on a table that is not consecutive
    hits = [table[: -(-end // 16)] for step in steps for start, end, table in step if start == 48 and end > 49]
    assert any(t != list(range(t[0], t[0] + len(t))) for t in hits), hits
    mixed = [step for step in steps if {e - s == 1 for s, e, _ in step} == {True, False}]
    assert mixed, "no step mixed decodes with prefill chunks"
    assert max(len(step) for step in steps) >= 3
    plain = Engine(EngineConfig(**settings, attention_backend="torch"))
    assert workload(plain) == got


def test_preempted_requests_match_the_torch_path(tiny_llama):
    settings = dict(model=str(tiny_llama), quantization="none", num_kv_blocks=12, block_size=16)
    prompts = [list(range(100 + 7 * i, 160 + 7 * i)) for i in range(4)]  # 4 x (60 + 12) tokens > 12 blocks
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    flex = Engine(EngineConfig(**settings, attention_backend="flex"))
    got = [o.token_ids for o in flex.generate(prompts, params)]
    assert flex.stats().num_preempted_total > 0
    plain = Engine(EngineConfig(**settings, attention_backend="torch"))
    assert got == [o.token_ids for o in plain.generate(prompts, params)]


def test_each_step_waits_at_most_once(tiny_llama, sync_counter):  # noqa: F811
    """Counted on a second run of the same requests: the first traces each new shape through dynamo, whose
    tracing (on fake tensors, no device involved) calls the counted methods. A layer with another softmax scale
    runs first: a scale that changes must not turn into a value read back on every call."""
    run_layer(compiled=False)
    engine = Engine(EngineConfig(model=str(tiny_llama), quantization="none", num_kv_blocks=32,
                                 max_num_batched_tokens=32, attention_backend="flex", speculation="off"))
    # speculation off: the second run's replies repeat the first's, so lookup's drafts would be kept and the
    # replies take fewer steps than tokens (as many as auto's timing says)
    prompts = ("a prompt long enough to be cut into chunks " * 3, "hi", "another one, of middling length")
    per_step = []
    for _ in range(2):
        per_step.clear()
        for prompt in prompts:
            engine.add_request(engine.encode_prompt(prompt), SamplingParams(max_tokens=6, temperature=0.8, seed=3))
        while engine.has_unfinished():
            before = sync_counter["n"]
            engine.step()
            per_step.append(sync_counter["n"] - before)
    assert len(per_step) > 4 and set(per_step) <= {0, 1} and 1 in per_step, per_step


# -- which backend, and why ---------------------------------------------------------------------------


def test_auto_on_cuda_prefers_flash_then_torch_and_takes_flex_only_by_name():
    assert choose_backend("auto", True, None, None) == ("flash_attn", "flash-attn's paged kernel")
    backend, reason = choose_backend("auto", True, "flash-attn is not installed", None)
    assert backend == "torch" and reason.startswith("flash-attn is not installed; FlexAttention only when asked")
    assert choose_backend("flex", True, "flash-attn is not installed", None) == ("flex", "chosen in the settings")


def test_auto_on_the_cpu_stays_on_the_torch_path():
    assert choose_backend("auto", False, None, None) == ("torch", "flash-attn runs on CUDA only")
    assert choose_backend("torch", True, None, None) == ("torch", "chosen in the settings")


def test_a_backend_asked_for_that_cannot_run_raises_with_the_reason():
    with pytest.raises(ValueError, match="'flex' was asked for, but torch 2.4 has no FlexAttention"):
        choose_backend("flex", True, None, "torch 2.4 has no FlexAttention")
    with pytest.raises(ValueError, match="'flash_attn' was asked for, but flash-attn computes"):
        choose_backend("flash_attn", True, "flash-attn computes in float16 or bfloat16, not float32", None)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        choose_backend("flash_attn", False, None, None)
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        EngineConfig(attention_backend="flexible")


def test_flex_problem_names_a_missing_compiler_or_an_old_torch(monkeypatch):
    import sys

    from torch.nn.attention.flex_attention import BlockMask

    assert flex_problem(CPU) is None
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton raises ImportError
    assert "needs triton on CUDA" in flex_problem(torch.device("cuda"))
    assert flex_problem(CPU) is None  # the CPU needs no triton
    monkeypatch.setattr(BlockMask, "from_kv_blocks", classmethod(lambda cls, kv_num_blocks, kv_indices: None))
    assert "builds no inference-only block masks" in flex_problem(CPU)


def test_engine_refuses_flex_where_the_probe_says_it_cannot_run(tiny_llama, monkeypatch):
    monkeypatch.setattr(flex_attention, "flex_problem", lambda device: "torch.compile is unavailable here")
    with pytest.raises(ValueError, match="'flex' was asked for, but torch.compile is unavailable here"):
        Engine(EngineConfig(model=str(tiny_llama), quantization="none", attention_backend="flex", num_kv_blocks=8))
    auto = Engine(EngineConfig(model=str(tiny_llama), quantization="none", num_kv_blocks=8))
    assert auto.stats().attention_backend == "torch"


def test_flex_runs_with_the_native_kernels_off(tiny_model_dirs):
    """A quantised model on the CPU keeps its packed layers but attends through FlexAttention, in the lean
    decoder; the native kernels compute the same arithmetic in another order, so logits agree to a tolerance."""
    from engine.tools.gpu_check import first_token_logits

    settings = dict(model=str(tiny_model_dirs["llama"]), quantization="int4", num_kv_blocks=16)
    flex = Engine(EngineConfig(**settings, attention_backend="flex"))
    native = Engine(EngineConfig(**settings, attention_backend="torch"))
    assert type(flex.runner.lean).__name__ == "LeanDecoder" and type(native.runner.lean).__name__ == "NativeDecoder"
    prompts = ["a prompt for a quantised model, long enough to fill a block", "a prompt for a quantised one"]
    for got, want in zip(first_token_logits(flex, prompts), first_token_logits(native, prompts)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_timing_tool_prints_one_line_per_step(monkeypatch, capsys):
    from engine.tools import flex_timing

    monkeypatch.setattr(flex_timing, "PLAN", [(3, 0), (1, 20)])
    monkeypatch.setattr(flex_timing, "NUM_BLOCKS", 64)
    assert flex_timing.main([]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(",")[0] for line in lines] == [" 3 decoding", " 1 decoding"]
    assert all("flex" in line and "torch path" in line and " ms" in line for line in lines)


def test_a_kernel_that_fails_to_compile_gives_way_to_the_torch_path(tiny_llama, monkeypatch):
    calls = []

    def failing(*args):
        calls.append(1)
        raise torch._dynamo.exc.TorchDynamoException("triton: out of shared memory\nmore lines of trace")

    monkeypatch.setattr(attention, "flex_paged_attention", failing)
    settings = dict(model=str(tiny_llama), quantization="none", num_kv_blocks=16)
    engine = Engine(EngineConfig(**settings, attention_backend="flex"))
    prompts = ["a first prompt", "and a second, a little longer"]
    got = [o.token_ids for o in engine.generate(prompts, GREEDY)]
    stats = engine.stats()
    assert stats.attention_backend == "torch" and len(calls) == 1
    assert stats.attention_reason == ("FlexAttention failed to compile here, so the torch path runs "
                                      "(TorchDynamoException: triton: out of shared memory)")
    plain = Engine(EngineConfig(**settings, attention_backend="torch"))
    assert got == [o.token_ids for o in plain.generate(prompts, GREEDY)]


def test_cuda_blocks_are_a_multiple_of_the_kernels_tile():
    cuda = torch.device("cuda")
    assert [flex_attention.flex_block_size(n, cuda) for n in (16, 64, 100, 256)] == [128, 128, 128, 256]
    assert flex_attention.flex_block_size(16, CPU) == 16


def test_the_command_line_asks_for_a_backend(tiny_llama):
    from engine.tools import cli

    args = cli.build_parser().parse_args(["generate", "--model", str(tiny_llama), "--attention", "flex", "hi"])
    assert cli.config_from(args).attention_backend == "flex"
    assert cli.config_from(cli.build_parser().parse_args(["generate", "hi"])).attention_backend == "auto"
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["generate", "--attention", "fast", "hi"])
