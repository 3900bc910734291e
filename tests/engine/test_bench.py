"""The benchmark harness runs every side on the same prompts and reports consistent figures."""

import json

from engine import EngineConfig
from engine.tools import bench_report
from engine.tools.bench import markdown_table, percentile, run_full, run_quick


def test_quick_bench_on_a_tiny_model(tiny_llama):
    report = run_quick(EngineConfig(model=str(tiny_llama), num_kv_blocks=256), concurrent=3, new_tokens=6)
    engine_batch, peer_batch = report["concurrent"]
    assert engine_batch["output_tokens"] == peer_batch["output_tokens"] == 18
    assert report["single"][0]["output_tokens"] == report["single"][1]["output_tokens"] == 6
    ratio = report["concurrent_tokens_per_s"][0] / report["concurrent_tokens_per_s"][1]
    assert abs(ratio - report["concurrent_ratio"]) < 1e-9
    table = markdown_table(report)
    assert "3 chats x 6 tokens" in table and f"{report['single_ratio']:.2f}x" in table


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 95) == 95.0
    assert percentile([3.0], 95) == 3.0 and percentile([], 50) is None


def test_full_bench_on_a_tiny_model_writes_every_output(tiny_llama, tmp_path, monkeypatch):
    monkeypatch.setenv("KVASIR_LLAMA_CPP_BIN", str(tmp_path / "no-build"))
    report = run_full(EngineConfig(model=str(tiny_llama), num_kv_blocks=512), chats=(1, 2), new_tokens=4,
                      progress=lambda m: None)
    kvasir = report["engines"]["kvasir"]
    assert [r["chats"] for r in kvasir["loads"]] == [1, 2]
    assert [r["output_tokens"] for r in kvasir["loads"]] == [4, 8]
    assert kvasir["system_prompt"]["cached_share"] > 0.5  # the second question reuses the system prompt
    assert kvasir["conversations"]["cached_share_later_turns"] > 0
    assert [r["output_tokens"] for r in report["engines"]["transformers"]["loads"]] == [4, 8]
    assert "GGUF" in report["engines"]["llama.cpp"]["skipped"]  # a model folder: llama.cpp cannot run it
    ratio = report["ratios"]["transformers"]["decode_tokens_per_s"]["2"]
    assert abs(ratio - kvasir["loads"][1]["decode_tokens_per_s"]
               / report["engines"]["transformers"]["loads"][1]["decode_tokens_per_s"]) < 1e-9

    written = bench_report.write_results(report, tmp_path / "results", progress=lambda m: None)
    names = {p.name for p in written}
    assert {"latest.json", "latest.md", f"{bench_report.file_stem(report)}.md"} <= names
    assert json.loads((tmp_path / "results" / "latest.json").read_text())["settings"]["chats"] == [1, 2]
    text = (tmp_path / "results" / "latest.md").read_text()
    assert f"{ratio:.2f}x" in text and "GGUF" in text and report["machine"]["cpu"] in text


def test_readme_table_is_rewritten_between_the_markers(tmp_path):
    readme, latest = tmp_path / "README.md", tmp_path / "latest.md"
    readme.write_text("# Title\n\n## Benchmark\n<!-- bench:start -->\nold table\n<!-- bench:end -->\n\n## Next\n")
    latest.write_text("| new | table |\n")
    bench_report.update_readme(readme, latest)
    assert readme.read_text() == ("# Title\n\n## Benchmark\n<!-- bench:start -->\n| new | table |\n"
                                  "<!-- bench:end -->\n\n## Next\n")
