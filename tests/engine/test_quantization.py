"""Each quantisation mode on the CPU: swapped layers, greedy parity with generate, memory that falls.

Also the packed modes' GGUF path: a Q4 GGUF file loaded in ``int4`` keeps the file's weights (its blocks
mapped, the q/k rows un-permuted as transformers does) and chats like the same file loaded in ``none``.
"""

import pytest
import torch

from engine import QUANTIZATIONS, Engine, EngineConfig, SamplingParams
from engine.config import PACKED_MODES
from engine.devices import resolve_quantization
from engine.models.fit import estimate, output_head, q4_k_linear_weights, weight_bytes
from engine.models.model_info import read_model_info
from engine.models.sources import resolve_source
from engine.step import kernels
from engine.step.block_linear import BlockQuantLinear
from engine.step.float_linear import FewRowsLinear
from engine.step.packed_linear import Int4Linear, Int8Linear
from engine.step.quantization import import_bitsandbytes
from engine.tools.plain_attention import plain_attention
from tests.helpers.oracle import reference_greedy
from tests.helpers.tiny_gguf import write_tiny_llama_gguf

bnb = import_bitsandbytes()
NATIVE = kernels.available()  # the CPU's packed layers: native Q4_1 / Q8_0 blocks, else torch's packed kernels
INT4_TYPE, W8_TYPE = (BlockQuantLinear, BlockQuantLinear) if NATIVE else (Int4Linear, Int8Linear)
FLOAT_TYPE = FewRowsLinear if NATIVE else torch.nn.Linear  # float32 layers on the CPU: few rows go native
LAYER_TYPE = {
    "none": FLOAT_TYPE, "int8": bnb.nn.Linear8bitLt, "nf4": bnb.nn.Linear4bit, "fp4": bnb.nn.Linear4bit,
    "int4": INT4_TYPE, "w8": W8_TYPE,
}
BLOCK_KIND = {"int4": "q4_1", "w8": "q8_0"}
QUANTISED = [mode for mode in LAYER_TYPE if mode != "none"]


def assert_greedy_parity(engine: Engine, prompts: list[list[int]], tokens: int) -> None:
    """The engine's greedy tokens equal transformers' ``generate`` on the engine's own modules."""
    outputs = engine.generate(prompts, SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True))
    with plain_attention(engine.loaded.model) as model:
        for prompt, out in zip(prompts, outputs):
            assert out.token_ids == reference_greedy(model, prompt, tokens)


@pytest.fixture(scope="module")
def engines(tiny_model_dirs):
    folder = tiny_model_dirs["qwen2"]  # has q/k/v biases too
    return {mode: Engine(EngineConfig(model=str(folder), quantization=mode, num_kv_blocks=128)) for mode in LAYER_TYPE}


@pytest.mark.parametrize("mode", list(LAYER_TYPE))
def test_linear_layers_are_swapped_and_the_rest_is_kept(engines, mode):
    model = engines[mode].loaded.model
    attn = model.model.layers[0].self_attn
    assert type(attn.q_proj) is LAYER_TYPE[mode] and type(model.model.layers[1].mlp.down_proj) is LAYER_TYPE[mode]
    head_type = W8_TYPE if mode in PACKED_MODES else FLOAT_TYPE  # packed modes pack the head too
    assert type(model.lm_head) is head_type
    if NATIVE and mode in PACKED_MODES:
        assert attn.q_proj.kind == BLOCK_KIND[mode] and model.lm_head.kind == "q8_0"
    if mode in PACKED_MODES:
        assert attn.q_proj.bias is not None and attn.q_proj.bias.dtype == torch.float32  # qwen2's q/k/v biases
    else:
        assert model.lm_head.weight.dtype == torch.float32
    assert model.model.embed_tokens.weight.dtype == torch.float32
    if mode == "nf4" or mode == "fp4":
        assert attn.q_proj.weight.quant_type == mode and attn.q_proj.weight.dtype == torch.uint8
    assert engines[mode].stats().quantization == mode


def test_every_mode_is_in_the_one_list():
    assert set(LAYER_TYPE) | {"auto"} == set(QUANTIZATIONS)


@pytest.mark.parametrize("mode", QUANTISED)
def test_greedy_parity_with_generate_on_the_same_quantised_modules(engines, mode):
    engine = engines[mode]
    prompts = [engine.encode_prompt([{"role": "user", "content": text}])
               for text in ("one two three", "a much longer message about rivers and mountains " * 3, "hi")]
    assert_greedy_parity(engine, prompts, 24)


def test_quantised_output_differs_from_full_precision_but_stays_close(engines):
    """The swap really happened (outputs change), yet the model still computes nearly the same thing."""
    prompt = [[{"role": "user", "content": "compare the modes"}]]
    logits = {}
    for mode, engine in engines.items():
        ids = torch.tensor([engine.encode_prompt(prompt[0])])
        with torch.inference_mode(), plain_attention(engine.loaded.model) as model:
            logits[mode] = model(ids).logits[0, -1]
    for mode in QUANTISED:
        assert not torch.equal(logits[mode], logits["none"])
        cos = torch.nn.functional.cosine_similarity(logits[mode], logits["none"], dim=0)
        assert cos > 0.95


def test_weight_memory_falls_nf4_below_int8_below_float32(engines, tiny_model_dirs):
    memory = {mode: engine.stats().model_memory_bytes for mode, engine in engines.items()}
    assert memory["nf4"] < memory["int8"] < memory["none"]
    assert memory["int4"] < memory["w8"] < memory["none"]
    assert memory["nf4"] == memory["fp4"]
    folder = str(tiny_model_dirs["qwen2"])
    for mode, measured in memory.items():
        predicted = estimate(EngineConfig(model=folder, quantization=mode)).weight_bytes
        assert abs(predicted - measured) <= 0.1 * measured, mode


def test_peak_load_memory_is_reported(engines):
    assert all(engine.stats().peak_load_bytes >= 0 for engine in engines.values())
    assert engines["none"].stats().peak_load_bytes > 0


# -- GGUF files in the packed modes: blocks kept, nothing converted ------------------------------------------


@pytest.fixture(scope="module")
def q4_ggufs(tiny_llama, tmp_path_factory):
    folder = tmp_path_factory.mktemp("q4-gguf")
    return {kind: write_tiny_llama_gguf(tiny_llama, folder / f"tiny-{kind}.gguf", linear_type=kind)
            for kind in ("Q4_1", "Q4_0", "Q8_0")}


@pytest.fixture(scope="module")
def q4_1_engines(q4_ggufs):
    path = str(q4_ggufs["Q4_1"])
    return {mode: Engine(EngineConfig(model=path, quantization=mode, num_kv_blocks=64)) for mode in ("none", "int4")}


def test_q4_gguf_in_int4_keeps_the_files_weights(q4_1_engines):
    """The packed weights are the ones transformers dequantises, q/k rows un-permuted alike (to bfloat16 scales)."""
    reference, packed = (q4_1_engines[mode].loaded.model for mode in ("none", "int4"))
    for index in range(len(reference.model.layers)):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.down_proj"):
            layer = packed.model.layers[index].get_submodule(name)
            expected = reference.model.layers[index].get_submodule(name).weight.detach()
            assert type(layer) is INT4_TYPE, name
            if NATIVE:  # the file's own blocks: exactly what transformers dequantises
                torch.testing.assert_close(layer.dequantize(), expected, atol=0, rtol=0)
            else:  # scales rounded to bfloat16 for torch's kernel
                scale = expected.abs().max()
                torch.testing.assert_close(layer.dequantize().float(), expected, atol=0.02 * scale.item(), rtol=0)
    assert type(packed.lm_head) is W8_TYPE
    assert torch.equal(packed.model.embed_tokens.weight, reference.model.embed_tokens.weight)


def test_q4_gguf_in_int4_chats_like_none(q4_1_engines):
    prompt = q4_1_engines["none"].encode_prompt([{"role": "user", "content": "rivers and mountains"}])
    logits = {}
    for mode, engine in q4_1_engines.items():
        with plain_attention(engine.loaded.model) as model, torch.inference_mode():
            logits[mode] = model(torch.tensor([prompt])).logits[0, -1]
    assert torch.nn.functional.cosine_similarity(logits["int4"], logits["none"], dim=0) > 0.99
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    first = {mode: engine.generate([prompt], params)[0].token_ids for mode, engine in q4_1_engines.items()}
    assert first["int4"][:4] == first["none"][:4]


def test_q4_gguf_in_int4_matches_generate_on_its_own_modules(q4_1_engines):
    engine = q4_1_engines["int4"]
    prompts = [engine.encode_prompt([{"role": "user", "content": text}]) for text in ("one two", "hi " * 20)]
    assert_greedy_parity(engine, prompts, 16)


@pytest.mark.skipif(not NATIVE, reason="Q4_K blocks are kept by the native kernels only")
def test_q4_k_gguf_in_int4_keeps_the_files_weights(tiny_llama, tokenizer_dir, tmp_path):
    """Q4_K (most GGUF downloads) is held exactly, with float32 sub-block scales, not quantised again."""
    from tests.helpers.tiny_models import write_tiny_model

    model_dir = write_tiny_model("llama", tmp_path / "wide", tokenizer_dir, hidden_size=256, intermediate_size=512,
                                 num_attention_heads=4, num_key_value_heads=2)
    path = write_tiny_llama_gguf(model_dir, tmp_path / "tiny-Q4_K.gguf", linear_type="Q4_K")
    engines = {mode: Engine(EngineConfig(model=str(path), quantization=mode, num_kv_blocks=32))
               for mode in ("none", "int4")}
    reference, packed = (engines[mode].loaded.model for mode in ("none", "int4"))
    for name in ("self_attn.q_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.down_proj"):
        layer = packed.model.layers[1].get_submodule(name)
        assert type(layer) is BlockQuantLinear and layer.kind == "q4_1f", name
        expected = reference.model.layers[1].get_submodule(name).weight.detach()
        torch.testing.assert_close(layer.dequantize(), expected, atol=0, rtol=0)
    assert engines["int4"].loaded.warnings == []  # nothing re-quantised
    measured = engines["int4"].stats().model_memory_bytes
    predicted = estimate(EngineConfig(model=str(path), quantization="int4")).weight_bytes
    assert abs(predicted - measured) <= 0.05 * measured
    source = resolve_source(str(path))  # and the estimate counts the float32 scales exactly
    info, q4_k = read_model_info(source), q4_k_linear_weights(source)
    assert q4_k == info.linear_parameter_count > 0
    args = (torch.float32, output_head(source), torch.device("cpu"))
    assert weight_bytes(info, "int4", *args, q4_k) - weight_bytes(info, "int4", *args) == q4_k * 4 // 32
    prompt = engines["int4"].encode_prompt([{"role": "user", "content": "rivers and mountains"}])
    assert_greedy_parity(engines["int4"], [prompt], 12)


@pytest.mark.skipif(not NATIVE, reason="embedding blocks are kept with the native kernels only")
@pytest.mark.parametrize("tied", [True, False])
def test_quantised_gguf_embedding_stays_in_its_blocks(tied, tokenizer_dir, tmp_path):
    """A Q8_0 token_embd is looked up in its blocks (no float32 table), and is the head when tied."""
    from engine.step.block_linear import BlockEmbedding
    from tests.helpers.tiny_models import write_tiny_model

    model_dir = write_tiny_model("llama", tmp_path / "model", tokenizer_dir, tie_word_embeddings=tied)
    path = write_tiny_llama_gguf(model_dir, tmp_path / "tiny.gguf", linear_type="Q4_1", embedding_type="Q8_0")
    engines = {mode: Engine(EngineConfig(model=str(path), quantization=mode, num_kv_blocks=32))
               for mode in ("none", "int4")}
    reference, packed = (engines[mode].loaded.model for mode in ("none", "int4"))
    embedding = packed.get_input_embeddings()
    assert type(embedding) is BlockEmbedding and embedding.table.kind == "q8_0"
    ids = torch.tensor([[0, 5, 49151], [17, 17, 2]])
    torch.testing.assert_close(embedding(ids), reference.get_input_embeddings()(ids), atol=0, rtol=0)
    assert (packed.lm_head is embedding.table) == tied
    assert not any(p.dtype == torch.float32 and p.numel() >= 49152 * 64 for p in packed.parameters())
    measured = engines["int4"].stats().model_memory_bytes
    predicted = estimate(EngineConfig(model=str(path), quantization="int4")).weight_bytes
    assert abs(predicted - measured) <= 0.05 * measured
    prompt = engines["int4"].encode_prompt([{"role": "user", "content": "rivers and mountains"}])
    assert_greedy_parity(engines["int4"], [prompt], 12)
    with pytest.raises(RuntimeError, match="outside"):
        embedding(torch.tensor([49152]))


def test_packed_gguf_load_keeps_only_its_headers_and_reuses_them(q4_ggufs, tmp_path, monkeypatch):
    """No converted copy of the weights: only config.json and the tokenizer are kept, and later loads read
    them instead of parsing the GGUF file's metadata through transformers again (seconds for a real file)."""
    import transformers

    monkeypatch.setenv("KVASIR_CACHE_DIR", str(tmp_path / "cache"))
    config = EngineConfig(model=str(q4_ggufs["Q4_0"]), quantization="int4", num_kv_blocks=32)
    first = Engine(config)
    assert first.loaded.loaded_from == q4_ggufs["Q4_0"]
    copies = list((tmp_path / "cache" / "gguf").iterdir())
    assert [copy.name.endswith("-headers") for copy in copies] == [True]
    assert (copies[0] / "config.json").is_file() and not list(copies[0].glob("*.safetensors"))

    def refuse_gguf(real):
        def read(*args, **kwargs):
            assert not kwargs.get("gguf_file"), "the GGUF file's metadata was parsed again"
            return real(*args, **kwargs)
        return read

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained",
                        refuse_gguf(transformers.AutoConfig.from_pretrained))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        refuse_gguf(transformers.AutoTokenizer.from_pretrained))
    second = Engine(config)
    prompt = first.encode_prompt([{"role": "user", "content": "rivers and mountains"}])
    assert second.encode_prompt([{"role": "user", "content": "rivers and mountains"}]) == prompt
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    assert second.generate([prompt], params)[0].token_ids == first.generate([prompt], params)[0].token_ids


def test_q8_gguf_linear_weights_stay_8_bit(q4_ggufs):
    engine = Engine(EngineConfig(model=str(q4_ggufs["Q8_0"]), quantization="int4", num_kv_blocks=32))
    layer = engine.loaded.model.model.layers[0].mlp.up_proj
    assert type(layer) is W8_TYPE
    if NATIVE:
        assert layer.kind == "q8_0"
    assert engine.loaded.warnings == []  # Q8_0 kept, or as int8 rows: no re-quantisation worth a warning


def test_packed_gguf_memory_matches_the_estimate(q4_1_engines, q4_ggufs):
    measured = q4_1_engines["int4"].stats().model_memory_bytes
    predicted = estimate(EngineConfig(model=str(q4_ggufs["Q4_1"]), quantization="int4")).weight_bytes
    assert abs(predicted - measured) <= 0.1 * measured


def test_auto_on_the_cpu_follows_the_gguf_weights(q4_ggufs, tiny_llama, tmp_path):
    cpu = torch.device("cpu")
    f32 = write_tiny_llama_gguf(tiny_llama, tmp_path / "f32.gguf")
    chosen = {kind: resolve_quantization("auto", cpu, resolve_source(str(path))) for kind, path in q4_ggufs.items()}
    assert chosen == {"Q4_1": "int4", "Q4_0": "int4", "Q8_0": "w8"}
    assert resolve_quantization("auto", cpu, resolve_source(str(f32))) == "none"
    assert resolve_quantization("auto", cpu, resolve_source(str(tiny_llama))) == "none"


def test_on_cuda_the_packed_modes_keep_the_output_head_in_the_compute_dtype(tiny_llama):
    """torch's int8 head on CUDA dequantises the whole matrix every call; there the head stays a float linear
    layer, and the estimate counts it so (on the CPU it gets its 8-bit copy)."""
    from transformers import AutoModelForCausalLM

    from engine.models.fit import INT4_BYTES_PER_WEIGHT
    from engine.step.quantization import pack_output_head, quantizable_linears

    model = AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32)
    linear = sum(layer.weight.numel() for _, _, layer in quantizable_linears(model))
    rest = sum(p.numel() for p in model.parameters()) - linear  # embeddings, norms and the untied head
    head = model.get_output_embeddings()
    pack_output_head(model, torch.device("cuda"))
    assert model.get_output_embeddings() is head
    pack_output_head(model, torch.device("cpu"))
    assert type(model.get_output_embeddings()) is W8_TYPE
    source = resolve_source(str(tiny_llama))
    info, layout = read_model_info(source), output_head(source)
    on_cuda = weight_bytes(info, "int4", torch.bfloat16, layout, torch.device("cuda"))
    assert on_cuda == rest * 2 + int(linear * INT4_BYTES_PER_WEIGHT)
    assert weight_bytes(info, "int4", torch.bfloat16, layout, torch.device("cpu")) < on_cuda


def test_the_cuda_int4_layout_is_the_widest_each_shape_takes():
    from engine.step.packed_linear import cuda_inner_k_tiles

    assert [cuda_inner_k_tiles(n) for n in (4096, 1536, 576, 192, 96, 32)] == [8, 8, 4, 4, 2, 2]
