"""The benchmark harness runs both sides on the same prompts and reports consistent figures."""

from engine import EngineConfig
from engine.tools.bench import markdown_table, run_quick


def test_quick_bench_on_a_tiny_model(tiny_llama):
    report = run_quick(EngineConfig(model=str(tiny_llama), num_kv_blocks=256), concurrent=3, new_tokens=6)
    engine_batch, peer_batch = report["concurrent"]
    assert engine_batch["output_tokens"] == peer_batch["output_tokens"] == 18
    assert report["single"][0]["output_tokens"] == report["single"][1]["output_tokens"] == 6
    ratio = report["concurrent_tokens_per_s"][0] / report["concurrent_tokens_per_s"][1]
    assert abs(ratio - report["concurrent_ratio"]) < 1e-9
    table = markdown_table(report)
    assert "3 chats x 6 tokens" in table and f"{report['single_ratio']:.2f}x" in table
