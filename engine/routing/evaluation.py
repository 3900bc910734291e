"""How well each model of a route answers, how fast, and what the router chooses: ``python -m engine eval-route``.

Every model answers every task of a small shipped set (short factual questions, arithmetic, small Python
functions; ``engine/data/route_tasks.json``) with greedy decoding, one task at a time so that TTFT and speed are
the model's alone. A reply is right when each of its task's patterns occurs in it. The router then routes every
task among the same resident models, and the routed accuracy is that of the answers the chosen models gave.

The latest evaluation is kept in Kvasir's cache folder (:func:`saved_path`) for the app's routing dialog.
"""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from ..devices import cpu_name
from ..sampling_params import SamplingParams
from .router import Request, Router, Routes

CATEGORIES = ("factual", "arithmetic", "code")
SAVED_NAME = "route_eval.json"


@dataclass(frozen=True, slots=True)
class Task:
    category: str
    prompt: str
    patterns: tuple[str, ...]

    def passes(self, reply: str) -> bool:
        """Whether every pattern occurs in ``reply`` (case-insensitive)."""
        return all(re.search(p, reply, re.IGNORECASE) for p in self.patterns)

    def messages(self) -> list[dict]:
        return [{"role": "user", "content": self.prompt}]


@dataclass(frozen=True, slots=True)
class TaskSet:
    tasks: tuple[Task, ...]
    max_tokens: dict[str, int]

    @classmethod
    def shipped(cls) -> TaskSet:
        return cls.from_dict(json.loads(resources.files("engine").joinpath("data/route_tasks.json").read_text()))

    @classmethod
    def from_dict(cls, data: dict) -> TaskSet:
        tasks = tuple(Task(t["category"], t["prompt"], tuple(t["patterns"])) for t in data["tasks"])
        unknown = {t.category for t in tasks} - set(data["max_tokens"])
        if unknown:
            raise ValueError(f"no max_tokens for the task categories {', '.join(sorted(unknown))}")
        return cls(tasks, dict(data["max_tokens"]))

    def limited(self, per_category: int | None) -> TaskSet:
        """The first ``per_category`` tasks of each category (None: all)."""
        if per_category is None:
            return self
        kept, seen = [], {}
        for task in self.tasks:
            seen[task.category] = seen.get(task.category, 0) + 1
            if seen[task.category] <= per_category:
                kept.append(task)
        return TaskSet(tuple(kept), self.max_tokens)


@dataclass(frozen=True, slots=True)
class Answer:
    """One model's reply to one task."""

    task: int  # index into the task set
    correct: bool
    text: str
    ttft_s: float | None
    output_tokens: int
    decode_tokens_per_s: float | None


@dataclass(slots=True)
class ModelScore:
    model: str
    answers: list[Answer] = field(default_factory=list)

    def accuracy(self, tasks: TaskSet, category: str | None = None) -> float | None:
        """The share of right answers (in ``category``; None: all); None where there were no such tasks."""
        marks = [a.correct for a in self.answers if category is None or tasks.tasks[a.task].category == category]
        return sum(marks) / len(marks) if marks else None

    @property
    def ttft_p50_s(self) -> float | None:
        values = [a.ttft_s for a in self.answers if a.ttft_s is not None]
        return statistics.median(values) if values else None

    @property
    def tokens_per_s(self) -> float | None:
        """Decode speed over all the replies: their tokens after the first over the time they took."""
        timed = [(a.output_tokens - 1, (a.output_tokens - 1) / a.decode_tokens_per_s) for a in self.answers
                 if a.decode_tokens_per_s and a.output_tokens > 1]
        seconds = sum(s for _, s in timed)
        return sum(n for n, _ in timed) / seconds if seconds > 0 else None


@dataclass(frozen=True, slots=True)
class Choice:
    """Where the router sent one task, and why."""

    task: int
    model: str
    reason: str


@dataclass(slots=True)
class RouteEvaluation:
    tasks: TaskSet
    models: list[ModelScore]
    choices: list[Choice]
    routes: dict
    cpu: str = field(default_factory=cpu_name)
    measured_at: float = field(default_factory=time.time)

    def score(self, model: str) -> ModelScore:
        return next(s for s in self.models if s.model == model)

    def routed_accuracy(self, category: str | None = None) -> float | None:
        """The share of tasks the router's chosen model answered right."""
        marks = [self.answer_to(c).correct for c in self.choices
                 if category is None or self.tasks.tasks[c.task].category == category]
        return sum(marks) / len(marks) if marks else None

    def routed_share(self) -> dict[str, int]:
        """How many tasks the router sent to each model."""
        share = {s.model: 0 for s in self.models}
        for choice in self.choices:
            share[choice.model] = share.get(choice.model, 0) + 1
        return share

    def answer_to(self, choice: Choice) -> Answer:
        """The chosen model's answer to the task the router routed."""
        return next(a for a in self.score(choice.model).answers if a.task == choice.task)

    def to_dict(self) -> dict:
        return {
            "cpu": self.cpu, "measured_at": self.measured_at, "routes": self.routes,
            "tasks": [asdict(t) for t in self.tasks.tasks], "max_tokens": self.tasks.max_tokens,
            "models": [{"model": s.model, "answers": [asdict(a) for a in s.answers]} for s in self.models],
            "choices": [asdict(c) for c in self.choices],
        }

    @classmethod
    def from_dict(cls, data: dict) -> RouteEvaluation:
        tasks = TaskSet.from_dict({"tasks": data["tasks"], "max_tokens": data["max_tokens"]})
        models = [ModelScore(m["model"], [Answer(**a) for a in m["answers"]]) for m in data["models"]]
        return cls(tasks, models, [Choice(**c) for c in data["choices"]], data["routes"], data["cpu"],
                   data["measured_at"])

    def scores(self) -> dict[str, dict[str, float]]:
        """Each model's accuracy by kind of task, as a router's ``min_score`` rules read it."""
        return {s.model: {c: a for c in CATEGORIES if (a := s.accuracy(self.tasks, c)) is not None}
                for s in self.models}

    def rows(self) -> list[dict]:
        """One row per model and one for the router: accuracy per category and overall, TTFT p50, tokens/s,
        and how many tasks the router sent there (what the command prints and the app's table shows)."""
        share = self.routed_share()
        rows = [{"model": s.model, **{c: s.accuracy(self.tasks, c) for c in CATEGORIES},
                 "overall": s.accuracy(self.tasks), "ttft_p50_s": s.ttft_p50_s, "tokens_per_s": s.tokens_per_s,
                 "routed_tasks": share.get(s.model, 0)} for s in self.models]
        rows.append({"model": "auto (routed)", **{c: self.routed_accuracy(c) for c in CATEGORIES},
                     "overall": self.routed_accuracy(), "ttft_p50_s": self._routed_ttft(), "tokens_per_s": None,
                     "routed_tasks": len(self.choices)})
        return rows

    def _routed_ttft(self) -> float | None:
        values = [a.ttft_s for a in map(self.answer_to, self.choices) if a.ttft_s is not None]
        return statistics.median(values) if values else None

    def markdown(self) -> str:
        counts = {c: sum(t.category == c for t in self.tasks.tasks) for c in CATEGORIES}
        head = ("| model | " + " | ".join(f"{c} ({counts[c]})" for c in CATEGORIES)
                + " | overall | TTFT p50 | tok/s | tasks routed here |")
        lines = [head, "|" + "---|" * (len(CATEGORIES) + 5)]
        for row in self.rows():
            cells = [_percent(row[c]) for c in (*CATEGORIES, "overall")]
            ttft = f"{row['ttft_p50_s'] * 1000:.0f} ms" if row["ttft_p50_s"] is not None else "-"
            speed = f"{row['tokens_per_s']:.1f}" if row["tokens_per_s"] else "-"
            lines.append(f"| {row['model']} | " + " | ".join(cells) + f" | {ttft} | {speed} | {row['routed_tasks']} |")
        return "\n".join(lines) + f"\n\nCPU: {self.cpu}; greedy decoding, one task at a time."


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


async def evaluate(engine, tasks: TaskSet, router: Router,
                   progress: Callable[[str], None] = lambda _: None) -> RouteEvaluation:
    """Every resident model of ``engine`` (an :class:`~engine.AsyncEngine`) answers every task; then the
    router routes each task among them, its ``min_score`` rules reading the scores just measured (so the routed
    row grades the router on the tasks its scores came from)."""
    scores = []
    for model in engine.model_ids():
        score = ModelScore(model)
        for index, task in enumerate(tasks.tasks):
            score.answers.append(await _answer(engine, model, index, task, tasks.max_tokens[task.category]))
        progress(f"{model}: {_percent(score.accuracy(tasks))} right, TTFT p50 "
                 f"{(score.ttft_p50_s or 0) * 1000:.0f} ms, {score.tokens_per_s or 0:.1f} tok/s")
        scores.append(score)
    result = RouteEvaluation(tasks, scores, [], {})
    router.scores = result.scores()
    for index, task in enumerate(tasks.tasks):
        decision = router.route_on(engine, Request.of(task.messages()), fresh=True)
        result.choices.append(Choice(index, decision.model, decision.reason))
    result.routes = router.routes.to_dict()
    return result


async def _answer(engine, model: str, index: int, task: Task, max_tokens: int) -> Answer:
    final = None
    async for output in engine.stream(task.messages(), SamplingParams(max_tokens=max_tokens, temperature=0.0),
                                      source="eval-route", model=model):
        final = output
    m = final.metrics
    return Answer(index, task.passes(final.text), final.text, m.ttft_s, m.output_tokens, m.decode_tokens_per_s)


def run(configs: list, routes: Routes | None, per_category: int | None = None,
        progress: Callable[[str], None] = lambda _: None) -> RouteEvaluation:
    """Load ``configs`` (EngineConfigs) resident at once, evaluate them and unload them."""
    from ..serving.async_engine import AsyncEngine

    engine = AsyncEngine(configs[0])
    try:
        for config in configs[1:]:
            progress(f"loading {config.model} ({config.quantization})")
            asyncio.run(engine.load_model(config))
        return asyncio.run(evaluate(engine, TaskSet.shipped().limited(per_category), Router(routes), progress))
    finally:
        engine.shutdown()


def saved_path() -> Path:
    from ..models.gguf_cache import cache_root

    return cache_root() / SAVED_NAME


def save(evaluation: RouteEvaluation, path: Path | None = None) -> Path:
    path = path or saved_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(evaluation.to_dict(), indent=1), encoding="utf-8")
    partial.replace(path)
    return path


def load_saved(path: Path | None = None) -> RouteEvaluation | None:
    """The latest evaluation saved, or None where there is none or it cannot be read."""
    try:
        return RouteEvaluation.from_dict(json.loads((path or saved_path()).read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
