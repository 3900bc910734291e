"""One prepared run of the CUDA checks, for a machine that has torch and transformers and nothing else.

On the lent machine, from the repository root with the carry beside it (``make gpu-carry`` writes it here)::

    PYTHONPATH=build/gpu-carry/site python3 -m engine.tools.gpu_check --out "$OUT"

(``make gpu-check`` runs the same; ``--out`` defaults to ``$OUT`` where it is set). It builds random-weight llama
models on the device and runs each part on its own, so one failure does not hide the rest, in order of value,
printing each part's time as it goes:

1. versions and the device probes with their own errors;
2. every quantised layer's output against its own dequantised weight, int4 in each CUDA layout, timed
   (:mod:`.layer_check`: a wrong packing passes every other part);
3. greedy parity with transformers' ``generate`` in float32;
4. greedy replies with CUDA graphs against without, on ``cuda:0`` named explicitly (and the last GPU where
   there are several);
5. the calls per step that wait for the device;
6. the KV cache's default size (in the blocks the backend runs) and the memory held after two model switches;
7. the memory a failed capture leaves behind;
8. bfloat16 against float32;
9. decode tok/s at 1, 16 and 64 chats per quantisation, with CUDA graphs and without, against the bandwidth
   bound, for each of ``--sizes`` (default ``tiny,mid``: under 6 minutes on an H200 in all; ``llama3-8b``, Llama
   3 8B's shape, is optional and goes last);
10. FlexAttention against the torch path, both with graphs off (a graph replays the torch path's decode).

Everything goes to ``OUT/gpu-check.json``; the exit status is 1 when any part failed, or when ``--device cuda``
finds no usable GPU (a machine that claims one must not pass by skipping). ``--device cpu`` runs the same
checks on the CPU, with smaller models (``make gpu-check DEVICE=cpu``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from .gpu_carry import write_carry
from .layer_check import layer_outputs

PROMPTS = ["hello there", "a much longer prompt about paged attention and blocks " * 6, "short"]
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
MID = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16, num_attention_heads=16,
           num_key_value_heads=8)
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                 num_key_value_heads=8, rope_theta=500000.0)
SHAPES = {"tiny": TINY, "mid": MID, "llama3-8b": LLAMA3_8B}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.tools.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--carry", type=Path, default=Path("build/gpu-carry"), help="what --write-carry saved")
    parser.add_argument("--sizes", help="models for the decode part, from tiny, mid, llama3-8b "
                        "(default: tiny,mid on CUDA, tiny on the CPU)")
    parser.add_argument("--write-carry", type=Path, help="save the tokenizer and a trimmed bitsandbytes, then stop")
    args = parser.parse_args(argv)
    if args.write_carry:
        write_carry(args.write_carry)
        return 0
    sys.path.insert(0, str(args.carry / "site"))  # the carried bitsandbytes
    report: dict = {"device_asked": args.device, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    failed: list[str] = []
    began = time.perf_counter()

    def part(name: str, run) -> None:
        started = time.perf_counter()
        try:
            report[name] = run()
        except Exception as exc:  # each part reports its own failure; the others still run
            report[name] = {"error": f"{exc.__class__.__name__}: {exc}"}
            failed.append(name)
        took, total = time.perf_counter() - started, time.perf_counter() - began
        report.setdefault("seconds", {})[name] = round(took, 1)
        print(f"{name}: {took:.1f} s (total {total:.0f} s), {'FAILED' if name in failed else 'ok'}", flush=True)

    part("environment", lambda: environment(args.device))
    if args.device == "cuda" and not torch.cuda.is_available():
        failed.append("no usable CUDA device")
    else:
        with tempfile.TemporaryDirectory() as folder:
            run_parts(part, args.device, args.sizes, Path(folder), args.carry / "tokenizer")
    report["failed"] = failed
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu-check.json").write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps({"failed": failed}, indent=2))
    return 1 if failed else 0


def run_parts(part, device: str, sizes: str | None, folder: Path, tokenizer: Path) -> None:
    """Every part after the environment, most valuable first; models are built once, by the first part that
    needs them."""
    built: dict[str, Path] = {}

    def model(size: str) -> Path:
        if size not in built:
            built[size] = build_model(folder / size, SHAPES[size], tokenizer)
        return built[size]

    tiny = model("tiny")
    part("layer_outputs", lambda: layer_outputs(device))
    part("parity_float32", lambda: parity_float32(tiny, device))
    part("graphs_parity", lambda: graphs_parity(tiny, device))
    part("speculation", lambda: speculation(tiny, device))
    part("syncs_per_step", lambda: syncs_per_step(tiny, device))
    part("kv_sizing_and_switches", lambda: kv_sizing_and_switches(tiny, device))
    part("failed_capture_memory", lambda: failed_capture_memory(tiny, device))
    part("bfloat16_vs_float32", lambda: bfloat16_vs_float32(tiny, device))
    part("kv_formats", lambda: kv_formats(tiny, device))
    chosen = (sizes or ("tiny,mid" if device == "cuda" else "tiny")).split(",")
    for size in [s for s in chosen if s != "llama3-8b"]:
        part(f"decode_{size}", lambda size=size: decode_speed(model(size), device))
    part("flex_vs_torch", lambda: flex_vs_torch(model("mid" if device == "cuda" else "tiny"), device))
    if "llama3-8b" in chosen:
        part("decode_llama3-8b", lambda: decode_speed(model("llama3-8b"), device))


def environment(device: str) -> dict:
    import transformers

    from ..devices import bitsandbytes_problem, cuda_kernel_problem, resolve_device
    from ..step.attention import flash_attn_available

    info = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
            "transformers": transformers.__version__, "cuda_available": torch.cuda.is_available(),
            "flash_attn": flash_attn_available()}
    if device == "cuda" and torch.cuda.is_available():
        target = torch.device("cuda")
        info.update(name=torch.cuda.get_device_name(), capability=torch.cuda.get_device_capability(),
                    kernel_problem=cuda_kernel_problem(target), bitsandbytes_problem=bitsandbytes_problem(target),
                    memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1))
    info["resolved"] = [str(part) for part in resolve_device(device)]
    return info


def build_model(folder: Path, shape: dict, tokenizer: Path) -> Path:
    """A random-weight llama model of ``shape`` with the carried tokenizer, saved as safetensors."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    vocab = len(AutoTokenizer.from_pretrained(tokenizer))
    config = LlamaConfig(vocab_size=vocab, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
                         pad_token_id=2, tie_word_embeddings=False, **shape)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2:
                param.normal_(0.0, 1.0 if "embed" in name else 0.02)
            else:
                param.fill_(1.0)  # the norms
    model.to(torch.bfloat16 if shape is LLAMA3_8B else torch.float32).save_pretrained(folder)
    for file in tokenizer.iterdir():
        shutil.copy(file, folder / file.name)
    return folder


def _engine(model: Path, device: str, **settings):
    from .. import Engine, EngineConfig

    return Engine(EngineConfig(model=str(model), device=device, **settings))


def parity_float32(model: Path, device: str) -> dict:
    """Greedy tokens identical to transformers' generate on the same weights, in float32."""
    from transformers import AutoModelForCausalLM

    from .. import SamplingParams

    engine = _engine(model, device, dtype="float32", quantization="none", num_kv_blocks=64)
    reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).to(device)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    mismatches = []
    for prompt, out in zip(PROMPTS, engine.generate(PROMPTS, params)):
        ids = engine.encode_prompt(prompt)
        want = reference.generate(torch.tensor([ids], device=device), max_new_tokens=24, min_new_tokens=24,
                                  do_sample=False, pad_token_id=2)[0, len(ids):].tolist()
        if out.token_ids != want:
            mismatches.append({"prompt": prompt[:30], "got": out.token_ids, "want": want})
    if mismatches:
        raise AssertionError(f"greedy tokens differ from generate: {mismatches}")
    stats = engine.stats()
    return {"identical": len(PROMPTS), "attention": stats.attention_backend, "reason": stats.attention_reason}


def kv_formats(model: Path, device: str) -> dict:
    """Every KV cache format the device runs (fp8 on CUDA): its quality against a float32 cache through the paged
    prefill path, and greedy replies served in it (CUDA graphs included) next to the float32 cache's."""
    from .. import SamplingParams
    from .kv_evaluation import check_kv_formats

    engine = _engine(model, device, dtype="float32", quantization="none", num_kv_blocks=64, kv_cache_dtype="float32")
    report = {row.kv_dtype: {"kl": row.kl_divergence, "top1": row.top1_agreement} for row in check_kv_formats(engine)}
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    reference = [out.token_ids for out in engine.generate(PROMPTS, params)]
    del engine
    for name in report:
        engine = _engine(model, device, dtype="float32", quantization="none", num_kv_blocks=64, kv_cache_dtype=name)
        replies = [out.token_ids for out in engine.generate(PROMPTS, params)]
        same = sum(a == b for reply, want in zip(replies, reference) for a, b in zip(reply, want))
        report[name].update(same_greedy_tokens=same, of=sum(map(len, reference)),
                            attention=engine.stats().attention_backend, graphs=engine.stats().cuda_graphs)
        del engine
        _return_memory(device)
    bad = {n: r for n, r in report.items() if n != "float32" and (r["kl"] > 0.05 or r["top1"] < 0.8)}
    if bad:
        raise AssertionError(f"KV formats far from the float32 cache: {bad}")
    return report


def bfloat16_vs_float32(model: Path, device: str) -> dict:
    """The first reply token's logits in bfloat16 against float32 (a tolerance, not token equality)."""
    logits = {}
    for dtype in ("float32", "bfloat16"):
        engine = _engine(model, device, dtype=dtype, quantization="none", num_kv_blocks=64)
        [logits[dtype]] = first_token_logits(engine, [PROMPTS[1]])
    [cosine], [same_argmax] = _agreement([logits["float32"]], [logits["bfloat16"]])
    if cosine < 0.99:
        raise AssertionError(f"bfloat16 logits drift from float32's: cosine {cosine:.4f}")
    return {"cosine": cosine, "same_argmax": same_argmax}


def _agreement(first: list[torch.Tensor], second: list[torch.Tensor]) -> tuple[list[float], list[bool]]:
    """Per pair of logit vectors: their cosine similarity, and whether they pick the same greedy token."""
    cosines = [float(torch.nn.functional.cosine_similarity(a, b, dim=0)) for a, b in zip(first, second)]
    return cosines, [int(a.argmax()) == int(b.argmax()) for a, b in zip(first, second)]


def first_token_logits(engine, prompts: list[str]) -> list[torch.Tensor]:
    """Each prompt's logits for its first new token, recorded where the sampler receives them. The prompts go
    one at a time, so a later one finds an earlier one's shared prefix in the cache."""
    from .. import SamplingParams

    recorded: list[torch.Tensor] = []
    sampler = engine.runner.sampler

    def record(logits, rows):
        recorded.extend(row.float().cpu() for row, sampling in zip(logits, rows) if sampling.output_index == 0)
        return sampler(logits, rows)

    engine.runner.sampler = record
    try:
        for prompt in prompts:
            engine.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))
    finally:
        engine.runner.sampler = sampler
    return recorded


# the flex check: a prompt long enough for several prefill chunks, and decode at 16 chats of some context
FLEX_SHAPES = {"cuda": dict(prompt_words=2400, chunk=512, context=2048, new_tokens=64),
               "cpu": dict(prompt_words=240, chunk=64, context=64, new_tokens=8)}


def flex_vs_torch(model: Path, device: str) -> dict:
    """The FlexAttention backend against the torch path: first-token logits for a long prompt prefilled in
    chunks, then (after an unrelated request took the next blocks) the same prompt with a new ending, a prefix
    hit on blocks that are not consecutive, within the bfloat16 tolerance; and decode tok/s at 16 chats on
    each, timed after a warm-up run (which on CUDA compiles the flex kernels), with CUDA graphs off for both. On
    the CPU flex runs uncompiled."""
    from .bench import kvasir_load
    from .evaluation import eval_text

    shape = FLEX_SHAPES[device]
    words = eval_text().split()
    long = " ".join(words[: shape["prompt_words"]])
    prompts = [long, " ".join(words[-200:]), long + " What happens next, in one sentence?"]
    # graphs off for both: a graph replays the torch path's decode attention whatever the backend
    settings = dict(dtype="bfloat16" if device == "cuda" else "float32", quantization="none", cuda_graphs=False,
                    max_num_batched_tokens=shape["chunk"], **({} if device == "cuda" else {"num_kv_blocks": 96}))
    logits, speed, stats = {}, {}, {}
    for backend in ("flex", "torch"):
        engine = _engine(model, device, attention_backend=backend, **settings)
        logits[backend] = first_token_logits(engine, prompts)
        text_ids = engine.tokenizer.encode(eval_text(), add_special_tokens=False)
        chats = [[text_ids[(salt * 16 + i) * 97 % (len(text_ids) - shape["context"]) + j]
                  for j in range(shape["context"])] for salt in (1, 2) for i in range(16)]
        kvasir_load(engine, chats[:16], shape["new_tokens"])  # warm-up: traces (CUDA: compiles) the shapes
        speed[backend] = round(kvasir_load(engine, chats[16:], shape["new_tokens"]).decode_tokens_per_s or 0.0, 1)
        stats[backend] = engine.stats()
        del engine
        _return_memory(device)
    flex = stats["flex"]
    if flex.attention_backend != "flex":
        raise AssertionError(f"the flex engine ran {flex.attention_backend} ({flex.attention_reason})")
    cosines, same_argmax = _agreement(logits["flex"], logits["torch"])
    result = {"cosines": cosines,
              "max_abs_diff": max(float((a - b).abs().max()) for a, b in zip(logits["flex"], logits["torch"])),
              "same_argmax": same_argmax, "cached_prompt_tokens": flex.cached_prompt_tokens_total,
              "block_size": flex.block_size,
              "decode_16_chats_tok_s": speed, "flex_over_torch": round(speed["flex"] / max(speed["torch"], 1e-9), 2),
              "compiled": device == "cuda", "context_tokens": shape["context"]}
    if min(cosines) < 0.99:
        raise AssertionError(f"flex logits drift from the torch path's: {result}")
    if result["cached_prompt_tokens"] == 0:
        raise AssertionError("the prefix hit did not happen")
    return result


def syncs_per_step(model: Path, device: str) -> dict:
    """Calls on the step's path that wait for the device (CUDA's sync debug mode where there is one)."""
    from .. import SamplingParams

    engine = _engine(model, device, quantization="none", num_kv_blocks=64, max_num_batched_tokens=32)
    for prompt in PROMPTS:
        engine.add_request(engine.encode_prompt(prompt), SamplingParams(max_tokens=8, temperature=0.7, seed=1))
    if device != "cuda":
        return {"note": "counted by CUDA's sync debug mode only; tests/engine/test_step_syncs.py counts on the CPU"}
    import warnings

    waits, captured = [], []
    torch.cuda.set_sync_debug_mode("warn")
    try:
        while engine.has_unfinished():
            graphs = engine.stats().cuda_graphs
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                engine.step()
            waits.append(sum("synchroniz" in str(w.message) for w in caught))
            captured.append(engine.stats().cuda_graphs > graphs)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    # torch.cuda.graph synchronises the device before it captures: a step that captured waits for that too
    steady = [n for n, capture in zip(waits, captured) if not capture]
    return {"steps": len(waits), "max_waits_per_step": max(waits), "per_step": waits,
            "steps_that_captured_a_graph": sum(captured), "max_waits_per_step_without_capture": max(steady, default=0)}


def kv_sizing_and_switches(model: Path, device: str) -> dict:
    """The KV cache sized by default (after the measured warm-up step), and the memory held after two
    switches (float32 -> bfloat16 -> float32) against the first load's: a leak shows as growth."""
    from .. import EngineConfig
    from ..models.memory import resident_bytes

    def held() -> int:
        if device == "cuda":
            torch.cuda.synchronize()
            return torch.cuda.memory_allocated()
        return resident_bytes()

    engine = _engine(model, device, dtype="float32", quantization="none")
    stats = engine.stats()
    first = held()
    result = {"step_peak_bytes": engine.step_peak_bytes, "kv_blocks": stats.kv_blocks_total,
              "block_size": stats.block_size, "attention": stats.attention_backend,
              "kv_cache_bytes": stats.kv_cache_memory_bytes, "held_after_load": first,
              "estimated_kv_tokens": engine.estimate(engine.config).kv_tokens,
              "allocated_kv_tokens": stats.kv_blocks_total * stats.block_size}
    for dtype in ("bfloat16", "float32"):
        engine.switch_model(EngineConfig(model=str(model), device=device, dtype=dtype, quantization="none"))
        result[f"held_after_switch_to_{dtype}"] = held()
    result["growth_bytes"] = result["held_after_switch_to_float32"] - first
    if device == "cuda" and abs(result["growth_bytes"]) > 64 * 2**20:
        raise AssertionError(f"device memory after two switches differs from the first load's: {result}")
    return result


def decode_speed(model: Path, device: str) -> dict:
    """Decode tok/s at 1, 16 and 64 chats x 64 tokens per quantisation, with CUDA graphs (the default) and, on
    CUDA, without them (``eager_*``); and the one-chat bandwidth bound."""
    from ..devices import bitsandbytes_problem

    modes = ["none", "int4"] + (["nf4"] if device == "cuda" and not bitsandbytes_problem(torch.device(device))
                                else [])
    bandwidth = _copy_bandwidth(device)
    results = {"copy_bandwidth_gb_s": round(bandwidth / 1e9, 1)}
    for mode in modes:
        engine = _engine(model, device, quantization=mode)
        weights = engine.stats().model_memory_bytes
        rows = {"weight_gib": round(weights / 2**30, 3), "bound_tok_s": round(bandwidth / weights, 1)}
        rows.update(_decode_rates(engine, ""))
        stats = engine.stats()
        rows.update(attention=stats.attention_backend, cuda_graphs=stats.cuda_graphs,
                    cuda_graphs_reason=stats.cuda_graphs_reason,
                    cuda_graph_memory_mib=round(stats.cuda_graph_memory_bytes / 2**20, 1))
        del engine
        _return_memory(device)
        if device == "cuda":
            rows.update(_decode_rates(_engine(model, device, quantization=mode, cuda_graphs=False), "eager_"))
            _return_memory(device)
        results[mode] = rows
    return results


def _return_memory(device: str) -> None:
    """Collect a dropped engine now, so that the next one's fit check and KV sizing see its memory free."""
    import gc

    from ..serving.warmup import release_cached_memory

    gc.collect()
    release_cached_memory(torch.device(device))


def _decode_rates(engine, prefix: str) -> dict:
    """``{prefix}{n}_chats_tok_s`` for 1, 16 and 64 chats; on CUDA each after a warm-up round of the same size
    (so first-use costs, CUDA-graph captures among them, stay out of the figure)."""
    from .bench import kvasir_load, prompt_set

    rates = {}
    for chats in (1, 16, 64):
        if engine.device.type == "cuda":
            kvasir_load(engine, prompt_set(engine, chats, salt=1000 + chats), 64)
        load = kvasir_load(engine, prompt_set(engine, chats, salt=chats), 64)
        rates[f"{prefix}{chats}_chats_tok_s"] = round(load.decode_tokens_per_s or 0.0, 1)
    return rates


def graphs_parity(model: Path, device: str) -> dict:
    """Greedy replies with CUDA graphs equal those without, on ``cuda:0`` named explicitly (and on the last GPU
    where there are several: a capture there with device 0 current would record nothing)."""
    if device != "cuda":
        return _graphs_parity_on(model, device)
    last = torch.cuda.device_count() - 1
    return {f"cuda:{index}": _graphs_parity_on(model, f"cuda:{index}") for index in sorted({0, last})}


def _graphs_parity_on(model: Path, device: str) -> dict:
    """Graphs against eager steps on ``device``, in float32 and bfloat16, over batches that are padded (3 and 5
    chats) and replies whose block tables cross a width bucket."""
    from .. import SamplingParams

    prompts = PROMPTS + ["one more chat", "and a fifth one, about graphs"]
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    result = {}
    for dtype in ("float32", "bfloat16"):
        replies = {}
        for graphs in (True, False):
            engine = _engine(model, device, dtype=dtype, quantization="none", num_kv_blocks=64, cuda_graphs=graphs)
            if graphs and engine.runner.graphs is None:  # the CPU, or a model the graphs do not take
                return {"note": engine.stats().cuda_graphs_reason}
            replies[graphs] = [[o.token_ids for o in engine.generate(batch, params)]
                               for batch in (prompts[:3], prompts)]
            stats = engine.stats()
            if graphs and not stats.cuda_graphs:
                raise AssertionError(f"no CUDA graph was captured: {stats.cuda_graphs_reason}")
            result[f"{dtype}_graphs" if graphs else f"{dtype}_eager"] = {
                "cuda_graphs": stats.cuda_graphs, "attention": stats.attention_backend}
            del engine
            _return_memory(device)
        got, want = sum(replies[True], []), sum(replies[False], [])
        same = sum(a == b for a, b in zip(got, want))
        result[f"{dtype}_identical"] = f"{same} of {len(want)}"
        # float32 must agree token for token; bfloat16 rounds the two attention formulations differently, so
        # a reply may drift late, but not in its first 16 tokens
        agreed = same == len(want) if dtype == "float32" else all(a[:16] == b[:16] for a, b in zip(got, want))
        if not agreed:
            raise AssertionError(f"{dtype}: greedy replies with graphs differ from eager ones: {got} vs {want}")
    return result


def speculation(model: Path, device: str) -> dict:
    """Greedy replies with drafts (n-gram lookup forced, and the model's own int4 copy as a draft model) equal
    those without, and the decode speed of each (float32, CUDA graphs where they run)."""
    from .. import SamplingParams

    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    settings = dict(dtype="float32", quantization="none", num_kv_blocks=128)
    result, replies = {}, {}
    draft = {"draft_model": str(model), "draft_quantization": "int4"}
    for mode, extra in (("off", {}), ("ngram", {}), ("draft", draft)):
        engine = _engine(model, device, speculation=mode, **settings, **extra)
        engine.generate(PROMPTS, SamplingParams(max_tokens=2, temperature=0.0))  # capture, warm up
        started = time.perf_counter()
        outputs = engine.generate(PROMPTS, params)
        seconds = time.perf_counter() - started
        replies[mode] = [o.token_ids for o in outputs]
        spec = engine.stats().speculation
        result[mode] = {"tokens_per_s": round(sum(len(r) for r in replies[mode]) / seconds, 1),
                        "drafted": spec.draft_tokens_total, "kept": spec.accepted_draft_tokens_total,
                        "cuda_graphs": engine.stats().cuda_graphs}
        del engine
        _return_memory(device)
    for mode in ("ngram", "draft"):
        if replies[mode] != replies["off"]:
            raise AssertionError(f"greedy replies with {mode} drafts differ: {replies[mode]} vs {replies['off']}")
    if not result["draft"]["drafted"]:
        raise AssertionError("the draft model wrote no draft")
    return result


def failed_capture_memory(model: Path, device: str) -> dict:
    """The device memory a failed capture leaves held: a step that reads back to the host inside the capture
    fails it, the engine turns graphs off and serves eagerly (the same tokens), and after the allocator's cache
    is returned the memory held should be what an engine that never captured holds."""
    from .. import SamplingParams

    if device != "cuda":
        return {"note": "not on the CPU"}
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    held, replies, reason = {}, {}, ""
    for graphs in (False, True):
        engine = _engine(model, device, dtype="bfloat16", quantization="none", num_kv_blocks=64, cuda_graphs=graphs)
        if graphs:
            steps, forward = engine.runner.graphs, engine.runner.graphs.forward

            def reads_back(inputs, batch, width, _forward=forward):
                _forward(inputs, batch, width)
                inputs.sum().item()  # refused while a stream is capturing

            steps.forward = reads_back
        replies[graphs] = [out.token_ids for out in engine.generate(PROMPTS, params)]
        reason = engine.stats().cuda_graphs_reason if graphs else reason
        _return_memory(device)
        held[graphs] = torch.cuda.memory_reserved()
        del engine
        _return_memory(device)
    result = {"reason": reason, "reserved_never_captured": held[False], "reserved_after_failed_capture": held[True],
              "kept_bytes": held[True] - held[False]}
    if not reason.startswith("capturing a decode step failed") or replies[True] != replies[False]:
        raise AssertionError(f"the failed capture did not fall back to the same eager replies: {result}")
    return result


def _copy_bandwidth(device: str) -> float:
    """Bytes a second one device-to-device copy moves (read plus write), the bound's denominator."""
    source = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    for _ in range(3):
        target.copy_(source)
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(10):
        target.copy_(source)
    if device == "cuda":
        torch.cuda.synchronize()
    return 2 * source.numel() * 10 / (time.perf_counter() - started)


if __name__ == "__main__":
    raise SystemExit(main())
