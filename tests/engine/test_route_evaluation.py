"""``eval-route``: each model scored on the task set, what the router chose and how right that was, kept for the
app; the shipped task set is sound."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from engine import AsyncEngine, Engine, EngineConfig, SamplingParams
from engine.routing.evaluation import (
    CATEGORIES,
    Answer,
    Choice,
    ModelScore,
    RouteEvaluation,
    Task,
    TaskSet,
    evaluate,
    load_saved,
    save,
)
from engine.routing.router import Router, Routes, Rule
from engine.tools.cli import main

pytestmark = pytest.mark.timeout(300)
PROMPTS = {"factual": "Where is the tower?", "code": "Write code that adds two numbers."}
MAX_TOKENS = {"factual": 6, "code": 10}


def tiny_config(model) -> EngineConfig:
    return EngineConfig(model=str(model), num_kv_blocks=64, max_model_len=256, kv_disk_cache=False)


def test_the_shipped_tasks_are_sound():
    tasks = TaskSet.shipped()
    assert {c: sum(t.category == c for t in tasks.tasks) for c in CATEGORIES} == dict.fromkeys(CATEGORIES, 12)
    for task in tasks.tasks:
        assert task.patterns and all(re.compile(p) for p in task.patterns)
        assert not task.passes(task.prompt), f"echoing the question would count as right: {task.prompt}"
    first_two = {c: [t for t in tasks.tasks if t.category == c][:2] for c in CATEGORIES}
    assert sorted(tasks.limited(2).tasks, key=tasks.tasks.index) == sorted(
        (t for kept in first_two.values() for t in kept), key=tasks.tasks.index)


def test_a_reply_is_right_when_every_pattern_occurs():
    task = Task("code", "square", (r"def\s+square\s*\(", r"\*\*\s*2|x\s*\*\s*x"))
    assert task.passes("```python\nDEF square(x):\n    return x ** 2\n```")  # case-insensitive
    assert not task.passes("def square(x):\n    return x + x")
    assert not task.passes("x ** 2")


@pytest.fixture(scope="module")
def expected(tiny_model_dirs):
    """What each tiny model says to each prompt, greedy, decoded alone by a plain Engine."""
    replies = {}
    for arch in ("llama", "qwen2"):
        engine = Engine(tiny_config(tiny_model_dirs[arch]))
        for category, prompt in PROMPTS.items():
            params = SamplingParams(max_tokens=MAX_TOKENS[category], temperature=0.0)
            replies[arch, category] = engine.generate([[{"role": "user", "content": prompt}]], params)[0].text
    assert replies["llama", "factual"] != replies["qwen2", "factual"]  # so "right" tells the models apart
    return replies


def test_each_model_is_scored_and_the_router_choice_is_graded(tiny_model_dirs, expected):
    # each task is "right" exactly when the reply is what llama says to it
    tasks = TaskSet(tuple(Task(c, p, (re.escape(expected["llama", c]),)) for c, p in PROMPTS.items()), MAX_TOKENS)
    engine = AsyncEngine(tiny_config(tiny_model_dirs["llama"]))
    try:
        asyncio.run(engine.load_model(tiny_config(tiny_model_dirs["qwen2"])))
        router = Router(Routes([Rule("qwen2", keywords=("code",))], fallback="llama"))
        result = asyncio.run(evaluate(engine, tasks, router))
    finally:
        engine.shutdown()
    llama, qwen2 = result.score("llama"), result.score("qwen2")
    assert [a.text for a in llama.answers] == [expected["llama", c] for c in PROMPTS]
    assert [a.text for a in qwen2.answers] == [expected["qwen2", c] for c in PROMPTS]
    assert (llama.accuracy(tasks), qwen2.accuracy(tasks, "factual")) == (1.0, 0.0)
    assert llama.ttft_p50_s > 0 and llama.tokens_per_s > 0
    assert [(c.model, c.reason) for c in result.choices] == [
        ("llama", "no rule matched: the fallback"), ("qwen2", "the message says 'code'")]
    assert (result.routed_accuracy("factual"), result.routed_accuracy("code")) == (1.0, 0.0)
    assert result.routed_share() == {"llama": 1, "qwen2": 1}
    rows = {row["model"]: row for row in result.rows()}
    assert rows["auto (routed)"]["overall"] == 0.5 and rows["llama"]["code"] == 1.0
    table = result.markdown()
    assert "| llama | 100% | - | 100% | 100% |" in table and "| auto (routed) | 100% | - | 0% | 50% |" in table


def test_an_evaluation_is_kept_and_read_back(tmp_path):
    tasks = TaskSet((Task("factual", "q", ("a",)),), {"factual": 4})
    result = RouteEvaluation(tasks, [ModelScore("m", [Answer(0, True, "a", 0.05, 3, 20.0)])],
                             [Choice(0, "m", "why")], Routes([], "m").to_dict())
    path = save(result, tmp_path / "eval.json")
    again = load_saved(path)
    assert again.to_dict() == result.to_dict() and again.score("m").tokens_per_s == 20.0
    path.write_text("{not json")
    assert load_saved(path) is None  # a damaged file is no evaluation, not a crash
    assert load_saved(tmp_path / "missing.json") is None


def test_the_command_prints_the_table_and_keeps_it_for_the_app(tiny_model_dirs, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KVASIR_CACHE_DIR", str(tmp_path))
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({"rules": [{"model": "qwen2", "has_code": False, "keywords": ["python"]}],
                                  "fallback": "llama"}))
    code = main(["eval-route", "--model", str(tiny_model_dirs["llama"]), "--model", str(tiny_model_dirs["qwen2"]),
                 "--kv-blocks", "64", "--per-category", "1", "--routes", str(routes), "--no-kv-disk-cache"])
    out = capsys.readouterr().out
    assert code == 0
    assert "| llama |" in out and "| qwen2 |" in out and "| auto (routed) |" in out
    saved = load_saved(tmp_path / "route_eval.json")
    assert [s.model for s in saved.models] == ["llama", "qwen2"] and len(saved.tasks.tasks) == 3
    assert [c.model for c in saved.choices] == ["llama", "llama", "qwen2"]  # the code task says "Python"


def test_bad_routes_are_refused_in_words(tmp_path, capsys):
    routes = tmp_path / "routes.json"
    routes.write_text(json.dumps({"rules": [{"model": "x"}]}))
    assert main(["eval-route", "--routes", str(routes)]) == 2
    assert "rule 1: the rule for x sets no condition" in capsys.readouterr().err
