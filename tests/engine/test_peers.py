"""Finding llama.cpp's tools and reading their output. Nothing here builds llama.cpp or needs its binaries: the
parsers read outputs captured from a real build (tests/engine/data/), and a missing tool is a note, not an error."""

import json
import os
from pathlib import Path

import pytest

from engine.tools import peers
from engine.tools.bench import llama_loads, measure_llama

DATA = Path(__file__).parent / "data"


def test_llama_bench_json_gives_prompt_and_decode_speeds():
    tests = peers.parse_llama_bench((DATA / "llama-bench.json").read_text())
    pp = next(t for t in tests if t["n_prompt"] and not t["n_gen"])
    tg = next(t for t in tests if t["n_gen"] and not t["n_prompt"])
    assert pp["n_prompt"] == 128 and tg["n_gen"] == 128
    assert pp["avg_ts"] > tg["avg_ts"] > 0  # a prompt is processed in parallel, decoding is token by token


def test_batched_bench_jsonl_rows_are_read_among_log_lines():
    rows = peers.parse_batched_bench((DATA / "llama-batched-bench.jsonl.txt").read_text())
    assert [r["pl"] for r in rows] == [1, 4]
    assert all(r["pp"] == 64 and r["tg"] == 16 for r in rows)
    for row in rows:  # the speeds are the counts over the times the tool printed
        assert row["speed_tg"] == pytest.approx(row["pl"] * row["tg"] / row["t_tg"], rel=1e-3)


def test_batched_bench_rows_become_load_results():
    rows = peers.parse_batched_bench((DATA / "llama-batched-bench.jsonl.txt").read_text())
    loads = llama_loads({"rows": rows})
    assert [(r["chats"], r["output_tokens"]) for r in loads] == [(1, 16), (4, 64)]
    assert loads[1]["ttft_p50_s"] == rows[1]["t_pp"] and loads[1]["itl_p50_s"] == rows[1]["t_tg"] / 16


def test_perplexity_reads_the_final_estimate():
    text = (DATA / "llama-perplexity.txt").read_text()
    value = peers.parse_perplexity(text)
    assert value is not None and 1 < value < 1000
    assert f"Final estimate: PPL = {value:.4f}" in text


def test_perplexity_falls_back_to_the_last_running_value():
    assert peers.parse_perplexity("[1]21.5,[2]19.25,[3]18.125,\n") == 18.125
    assert peers.parse_perplexity("nothing here") is None


def test_time_v_peak_memory_is_read_in_bytes():
    text = "\tCommand being timed: \"llama-bench\"\n\tMaximum resident set size (kbytes): 123456\n"
    assert peers.parse_time_v_rss(text) == 123456 * 1024
    assert peers.parse_time_v_rss("") is None


@pytest.fixture
def no_build(tmp_path, monkeypatch):
    monkeypatch.setenv(peers.ENV_BIN, str(tmp_path / "empty"))
    return tmp_path


def test_a_peer_that_is_not_built_is_skipped_with_a_note(no_build):
    assert peers.find_tool("llama-bench") is None
    run = peers.run_tool("llama-bench", ["-m", "x.gguf"])
    assert not run.ok and "make peers" in run.note
    for result in (peers.llama_bench(Path("x.gguf")), peers.batched_bench(Path("x.gguf")),
                   peers.perplexity(Path("x.gguf"), Path("t.txt"))):
        assert "not built" in result["skipped"] and "make peers" in result["skipped"]


def test_the_benchmark_carries_on_without_llama_cpp(no_build):
    result = measure_llama(no_build / "model.gguf", (1, 4), 8, [[], [], []], 2, progress=lambda m: None)
    for part in ("bench", "batched", "perplexity_chunks", "loads", "prompt", "system_prompt", "conversations",
                 "greedy_agreement"):
        assert "not built" in result[part]["skipped"]
    assert result["max_rss_bytes"] is None


def test_the_newest_cached_build_is_found(tmp_path, monkeypatch):
    monkeypatch.delenv(peers.ENV_BIN, raising=False)
    monkeypatch.setattr(peers, "cache_root", lambda: tmp_path)
    for version in ("9999.0.0", "11434.0.0"):
        (tmp_path / f"llama.cpp-{version}" / "bin").mkdir(parents=True)
    tool = tmp_path / "llama.cpp-11434.0.0" / "bin" / "llama-bench"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    (tmp_path / "llama.cpp-11434.0.0" / "build.json").write_text(json.dumps({"build_seconds": 900}))
    assert peers.bin_dir() == tool.parent  # 11434 > 9999 as numbers, not as strings
    assert peers.find_tool("llama-bench") == tool and peers.find_tool("llama-server") is None
    assert peers.build_info() == {"build_seconds": 900}


@pytest.mark.skipif(not os.access(peers.TIME_V, os.X_OK), reason="GNU time is not installed")
def test_a_tool_run_reports_its_output_and_peak_memory(tmp_path, monkeypatch):
    fake = tmp_path / "llama-bench"
    fake.write_text("#!/bin/sh\necho '[]'\n")
    fake.chmod(0o755)
    monkeypatch.setenv(peers.ENV_BIN, str(tmp_path))
    run = peers.run_tool("llama-bench", [])
    assert run.ok and run.stdout.strip() == "[]" and run.max_rss_bytes > 0
