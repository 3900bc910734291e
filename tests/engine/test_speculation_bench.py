"""The speculation benchmark's workloads are the ones the table names, its warm-up lets a draft model catch up on
the prompts, and its table reads its rows right."""

from types import SimpleNamespace

import pytest

from engine.tools.speculation_bench import (
    CHATS,
    DRAFT_MODES,
    MODES,
    WARM_TOKENS,
    draft_model_table,
    markdown_table,
    rewrite_prompts,
    story_prompts,
    summarise_runs,
    warm_tokens,
)


def test_the_rewrite_workload_is_a_300_line_file_with_one_rename_per_chat():
    prompts = rewrite_prompts(4)
    assert len(prompts) == 4 and len({p[0]["content"] for p in prompts}) == 4
    code = prompts[0][0]["content"].split("```python\n")[1].split("```")[0]
    assert len(code.splitlines()) == 300
    assert "renamed to `_drop_entry`" in prompts[0][0]["content"] and "def _forget" in code
    assert len(story_prompts(1)) == 1


def test_the_table_gives_each_mode_against_off_and_the_peer():
    rows = [{"workload": w, "chats": c, "mode": m, "tokens_per_s": {"off": 40.0, "ngram": 80.0, "auto": 60.0}[m],
             "vs_off": {"off": 1.0, "ngram": 2.0, "auto": 1.5}[m],
             "drafted": 100 if m != "off" else 0, "kept": 90 if m != "off" else 0, "same_as_off": True}
            for w in ("rewrite", "summarise", "story") for c in CHATS for m in MODES]
    peer = [{"workload": "rewrite", "chats": 1, "precision": "int4", "mode": "off", "tokens_per_s": 50.0},
            {"workload": "rewrite", "chats": 1, "precision": "int4", "mode": "ngram", "tokens_per_s": 45.0},
            {"workload": "rewrite", "chats": 1, "precision": "none", "mode": "off", "tokens_per_s": 20.0}]
    lines = markdown_table(rows, peer).splitlines()
    assert lines[2] == "| rewrite | 1 | 40.0 | 80.0 (2.00x) | 60.0 (1.50x) | 90/100 | 50.0 | 45.0 (0.90x) |"
    assert lines[3] == "| rewrite | 4 | 40.0 | 80.0 (2.00x) | 60.0 (1.50x) | 90/100 | – | – |"
    assert len(lines) == 2 + 3 * len(CHATS)


def test_the_draft_model_table_gives_each_mode_against_the_unquantised_model_alone():
    speeds = {"off": 20.0, "draft": 50.0, "auto": 45.0, "int4": 60.0}
    rows = [{"workload": w, "chats": c, "mode": m, "tokens_per_s": speeds[m], "vs_off": speeds[m] / speeds["off"],
             "drafted": 300 if m == "draft" else 0,
             "kept": 250 if m == "draft" else 0, "same_as_off": True}
            for w in ("rewrite", "summarise", "story") for c in CHATS for m in (*DRAFT_MODES, "int4")]
    peer = [{"workload": "rewrite", "chats": 1, "precision": "none", "mode": "off", "tokens_per_s": 25.0},
            {"workload": "rewrite", "chats": 1, "precision": "none", "mode": "draft", "tokens_per_s": 40.0},
            {"workload": "rewrite", "chats": 1, "precision": "int4", "mode": "off", "tokens_per_s": 70.0}]
    lines = draft_model_table(rows, peer).splitlines()
    assert lines[2] == ("| rewrite | 1 | 20.0 | 50.0 (2.50x) | 45.0 (2.25x) | 250/300 | 60.0 (3.00x) | 25.0 | "
                        "40.0 (1.60x) |")
    assert lines[3].endswith("| 60.0 (3.00x) | – | – |")
    assert len(lines) == 2 + 3 * len(CHATS)


def test_the_float32_copy_holds_the_files_weights_dequantised(tmp_path):
    import gguf
    import numpy as np

    from engine.models.sources import default_model_path
    from engine.tools.float_gguf import ALL_F32, FILE_TYPE_KEY, float32_copy

    source = default_model_path()
    copy = float32_copy(source, tmp_path)
    assert float32_copy(source, tmp_path) == copy  # written once
    original, full = gguf.GGUFReader(source), gguf.GGUFReader(copy)
    assert full.fields[FILE_TYPE_KEY].contents() == ALL_F32
    assert full.fields["tokenizer.ggml.tokens"].contents() == original.fields["tokenizer.ggml.tokens"].contents()
    tensors = {t.name: t for t in full.tensors}
    assert set(tensors) == {t.name for t in original.tensors}
    for tensor in original.tensors[:6]:
        copied = tensors[tensor.name]
        assert copied.tensor_type == gguf.GGMLQuantizationType.F32
        assert np.array_equal(copied.data, gguf.quants.dequantize(tensor.data, tensor.tensor_type))


def test_a_modes_ratio_to_off_is_the_median_of_each_rounds_own_ratio():
    def run(seconds, drafted=0):
        return {"seconds": seconds, "tokens": [[1] * 100], "drafted": drafted, "kept": drafted // 2}

    # the machine slows down from the second round on: each round auto is 5% slower than off in that round
    runs = {"off": [run(1.0), run(2.0), run(2.0)], "auto": [run(1.05, 10), run(2.1, 20), run(2.1, 30)]}
    summary = summarise_runs(runs)
    assert summary["off"]["tokens_per_s"] == 50.0 and summary["off"]["vs_off"] == 1.0
    assert summary["auto"]["vs_off"] == pytest.approx(1 / 1.05)  # not 50 / (100 / 1.05): the medians' ratio
    assert summary["auto"]["tokens_per_s"] == pytest.approx(100 / 2.1)
    assert (summary["auto"]["drafted"], summary["auto"]["kept"]) in {(20, 10), (30, 15)}  # a median round's


def _engine(draft: bool, budget: int = 2048):
    return SimpleNamespace(draft=object() if draft else None, config=SimpleNamespace(max_num_batched_tokens=budget),
                           encode_prompt=lambda chat: [0] * chat[0]["tokens"])


def test_the_warm_up_gives_a_draft_model_a_step_per_budget_of_prompt_tokens_twice_over():
    four_long = [[{"tokens": 3600}]] * 4  # 14,400 tokens: eight steps of what a 2,048-token step leaves
    assert warm_tokens(_engine(draft=True), four_long) == WARM_TOKENS + 2 * 8
    assert warm_tokens(_engine(draft=True), [[{"tokens": 100}]]) == WARM_TOKENS + 2
    assert warm_tokens(_engine(draft=False), four_long) == WARM_TOKENS  # nothing to catch up
