"""The prepared GPU check runs end to end on the CPU from a carry folder, and fails where CUDA is claimed but
absent (a check that skips there would pass on a broken machine)."""

import json
import shutil

import pytest
import torch

from engine.tools import gpu_carry, gpu_check, layer_check


def _carry(tmp_path, tokenizer_dir):
    carry = tmp_path / "carry"
    shutil.copytree(tokenizer_dir, carry / "tokenizer")
    return carry


def test_gpu_check_runs_on_the_cpu(tmp_path, tokenizer_dir):
    out = tmp_path / "out"
    status = gpu_check.main(["--device", "cpu", "--carry", str(_carry(tmp_path, tokenizer_dir)), "--out", str(out)])
    report = json.loads((out / "gpu-check.json").read_text())
    assert status == 0 and report["failed"] == []
    assert report["parity_float32"]["identical"] == len(gpu_check.PROMPTS)
    assert report["bfloat16_vs_float32"]["cosine"] > 0.99
    kv = report["kv_formats"]
    assert kv["float32"]["kl"] == 0 and kv["float32"]["same_greedy_tokens"] == kv["float32"]["of"] > 0
    assert {"bfloat16", "float16"} <= kv.keys() and "fp8" not in kv  # fp8 on CUDA only
    sizing = report["kv_sizing_and_switches"]
    assert sizing["kv_blocks"] > 0 and "held_after_switch_to_float32" in sizing
    flex = report["flex_vs_torch"]
    assert min(flex["cosines"]) > 0.99 and all(flex["same_argmax"]) and flex["cached_prompt_tokens"] > 0
    assert flex["compiled"] is False and all(rate > 0 for rate in flex["decode_16_chats_tok_s"].values())
    decode = report["decode_tiny"]
    assert {"none", "int4"} <= decode.keys() and all(decode[m]["64_chats_tok_s"] > 0 for m in ("none", "int4"))
    assert decode["none"]["cuda_graphs"] == 0 and decode["none"]["cuda_graphs_reason"] == "not on the CPU"
    assert "eager_64_chats_tok_s" not in decode["none"]  # graphs off is the same run on the CPU: not repeated
    assert report["graphs_parity"] == {"note": "not on the CPU"}
    spec = report["speculation"]
    assert spec["draft"]["drafted"] >= spec["draft"]["kept"] > 0 and spec["off"]["drafted"] == 0
    assert report["failed_capture_memory"] == {"note": "not on the CPU"}
    layers = report["layer_outputs"]
    assert set(layers) == {f"{i}x{o}" for i, o in layer_check.SHAPES["cpu"]}
    assert all(row["relative_error"] <= layer_check.TOLERANCE and row["ms_16_rows"] > 0
               for shape in layers.values() for row in shape.values())
    assert {"int4", "w8"} == set(layers["576x1536"])
    # most valuable first, each part timed
    parts = [key for key in report if key not in ("device_asked", "started", "seconds", "failed")]
    assert parts[:5] == ["environment", "layer_outputs", "parity_float32", "graphs_parity", "speculation"]
    assert parts[-1] == "flex_vs_torch" and set(report["seconds"]) == set(parts)


def test_the_layer_check_catches_a_wrong_int4_packing(monkeypatch):
    """Every other part compares quantised runs with each other, so a wrong packing would pass them all."""
    from engine.step import packed_linear

    pack = packed_linear._pack_int4
    monkeypatch.setattr(packed_linear, "_pack_int4", lambda codes, device, tiles=None: pack(15 - codes, device, tiles))
    with pytest.raises(AssertionError, match="int4: relative error"):
        layer_check.layer_outputs("cpu")


def test_the_carry_holds_one_cuda_library_and_fits(tmp_path):
    """64 MiB travel with the working tree: bitsandbytes ships a CUDA library per toolkit (over 120 MiB)."""
    size = gpu_carry.write_carry(tmp_path / "carry")
    libraries = sorted(p.name for p in (tmp_path / "carry" / "site" / "bitsandbytes").glob("libbitsandbytes_*"))
    assert libraries == ["libbitsandbytes_cpu.so", f"{gpu_carry.CUDA_LIBRARY}.so"]
    assert size == gpu_carry.carry_bytes(tmp_path / "carry") <= gpu_carry.CARRY_LIMIT_BYTES
    for name in ("tokenizer/tokenizer.json", "site/accelerate/__init__.py", "site/psutil/__init__.py",
                 "site/platformdirs/__init__.py"):
        assert (tmp_path / "carry" / name).is_file(), name


def test_gpu_check_fails_where_cuda_is_claimed_but_absent(tmp_path, tokenizer_dir):
    if torch.cuda.is_available():
        return  # this machine has a GPU: the claim holds
    out = tmp_path / "out"
    status = gpu_check.main(["--device", "cuda", "--carry", str(_carry(tmp_path, tokenizer_dir)), "--out", str(out)])
    report = json.loads((out / "gpu-check.json").read_text())
    assert status == 1 and "no usable CUDA device" in report["failed"]
    assert "no CUDA GPU found" in report["environment"]["error"] or "without CUDA" in report["environment"]["error"]


# What the lent GPU machines lack: they have torch and transformers (with their own dependencies) only, and
# gpu_check carries bitsandbytes, platformdirs, psutil and accelerate. Each of these is a dependency of the app
# or of the API server, never of the engine itself.
BARE_MACHINE_LACKS = ("gguf", "PySide6", "qasync", "starlette", "uvicorn", "keyring", "openai", "matplotlib")

BARE_ENGINE_SCRIPT = """
import importlib.abc, sys

class NotOnTheGpuMachine(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in LACKS:
            raise ModuleNotFoundError(f"No module named {name!r} (not on the GPU machine)")
        return None

sys.meta_path.insert(0, NotOnTheGpuMachine())
import engine.tools.gpu_check
from engine import Engine, EngineConfig, SamplingParams

for mode in ("none", "int4"):  # a plain load, and the streamed one that builds the model on meta first
    engine = Engine(EngineConfig(model=MODEL, device="cpu", quantization=mode, num_kv_blocks=8))
    [reply] = engine.generate(["hello"], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    print(mode, len(reply.token_ids))
"""


def test_the_engine_needs_only_what_the_gpu_check_carries(tiny_llama):
    """A module-level import of the API server, the app's or the GGUF reader's packages anywhere on the engine's
    path would stop ``make gpu-check`` on the lent machine before its first part (it once did: the API server's
    Starlette import)."""
    import subprocess
    import sys

    script = f"LACKS = {BARE_MACHINE_LACKS!r}\nMODEL = {str(tiny_llama)!r}\n" + BARE_ENGINE_SCRIPT
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["none", "3", "int4", "3"]
