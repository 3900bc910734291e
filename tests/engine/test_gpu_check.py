"""The prepared GPU check runs end to end on the CPU from a carry folder, and fails where CUDA is claimed but
absent (a check that skips there would pass on a broken machine)."""

import json
import shutil

import torch

from engine.tools import gpu_check


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


def test_gpu_check_fails_where_cuda_is_claimed_but_absent(tmp_path, tokenizer_dir):
    if torch.cuda.is_available():
        return  # this machine has a GPU: the claim holds
    out = tmp_path / "out"
    status = gpu_check.main(["--device", "cuda", "--carry", str(_carry(tmp_path, tokenizer_dir)), "--out", str(out)])
    report = json.loads((out / "gpu-check.json").read_text())
    assert status == 1 and "no usable CUDA device" in report["failed"]
    assert "no CUDA GPU found" in report["environment"]["error"] or "without CUDA" in report["environment"]["error"]
