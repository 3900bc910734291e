"""Routes: rules over what is knowable before a reply is generated, each naming the model that answers when it
matches, and a fallback.

A rule matches a request when every condition it sets holds: the last user message's length in characters
(``min_chars``, ``max_chars``), the whole conversation's (``min_context_chars``), attached code (``has_code``: a
fenced block, or lines that read as code), words in the message (``keywords``, any of them), a capability the
request needs (``needs``: ``"tools"`` or ``"json"``), and the rule's model's evaluated accuracy on the kind of
task the message is (``min_score``: the share of ``eval-route``'s tasks of that kind it answered right; the kind is
:func:`task_kind`'s guess: code, arithmetic or factual). The first rule that matches and whose model is resident
decides (resident models are preferred: routing never loads one); else the fallback does, else the primary
model. Routing is sticky: a conversation whose earlier turns ran on a model stays there while it is resident
(moving costs a whole re-prefill), unless the caller asks to route afresh.

Routes are stored as JSON (``Routes.to_json``): the app keeps them with its settings, ``kvasir serve --routes
FILE`` reads them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field

AUTO = "auto"  # the model name that asks for routing
STICKY_CONVERSATIONS = 4096  # conversations remembered for stickiness, least recently routed forgotten first
CODE_LINE = re.compile(r"^\s*(def |class |import |from \S+ import |#include|function |const |let |var |public |"
                       r"fn |for \(|if \(|return\b|SELECT |CREATE |[{}]\s*$|.*;\s*$)", re.MULTILINE)
CAPABILITIES = ("tools", "json")
CODE_WORDS = frozenset({"code", "function", "python", "program", "script", "debug", "class", "method", "compile"})
ARITHMETIC = re.compile(r"\d\s*([-+*/x×÷^]|plus|minus|times|divided by|multiplied by|percent of|to the power of)\s*\d|"
                        r"\b(calculate|sum of|product of|how much is)\b", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Request:
    """What a router reads of a request: its messages (OpenAI's shape) and the capabilities it needs."""

    messages: tuple[dict, ...]
    needs: frozenset[str] = frozenset()

    @classmethod
    def of(cls, prompt, needs=()) -> Request:
        """From a chat's messages (or a :class:`Chat`) or a completion's text."""
        prompt = getattr(prompt, "messages", prompt)
        messages = prompt if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt) else [
            {"role": "user", "content": prompt if isinstance(prompt, str) else ""}]
        return cls(tuple(messages), frozenset(needs))

    @property
    def last_user_text(self) -> str:
        return next((_text(m) for m in reversed(self.messages) if m.get("role") == "user"), "")

    @property
    def context_chars(self) -> int:
        return sum(len(_text(m)) for m in self.messages)

    def conversation_key(self) -> str:
        """What identifies the conversation across its turns: its system prompt and first user message."""
        system = next((_text(m) for m in self.messages if m.get("role") == "system"), "")
        first = next((_text(m) for m in self.messages if m.get("role") == "user"), "")
        return hashlib.sha256(json.dumps([system, first]).encode()).hexdigest()

    @property
    def is_first_turn(self) -> bool:
        return not any(m.get("role") == "assistant" for m in self.messages)


def _text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def has_code(text: str) -> bool:
    """A fenced code block, or at least three lines that read as code."""
    return "```" in text or len(CODE_LINE.findall(text)) >= 3


def task_kind(text: str) -> str:
    """What kind of task a message is, in the evaluation's categories: code (attached or asked for), arithmetic
    (numbers with an operation between them), else factual."""
    if has_code(text) or CODE_WORDS & set(re.findall(r"[a-z]+", text.lower())):
        return "code"
    return "arithmetic" if ARITHMETIC.search(text) else "factual"


@dataclass(frozen=True, slots=True)
class Rule:
    """``model`` answers the requests that meet every condition set (None: not a condition)."""

    model: str
    min_chars: int | None = None
    max_chars: int | None = None
    min_context_chars: int | None = None
    has_code: bool | None = None
    keywords: tuple[str, ...] = ()
    needs: str | None = None
    min_score: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError("a rule needs the model it routes to")
        for name in ("min_chars", "max_chars", "min_context_chars"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{name} must be a whole number of characters, not {value!r}")
        if self.needs is not None and self.needs not in CAPABILITIES:
            raise ValueError(f"needs must be one of {', '.join(CAPABILITIES)}, not {self.needs!r}")
        if not all(isinstance(k, str) and k.strip() for k in self.keywords):
            raise ValueError("keywords must be words")
        if self.min_score is not None and (isinstance(self.min_score, bool) or not isinstance(
                self.min_score, int | float) or not 0 <= self.min_score <= 1):
            raise ValueError(f"min_score must be a share of tasks from 0 to 1, not {self.min_score!r}")
        if not any(getattr(self, name) is not None for name in ("min_chars", "max_chars", "min_context_chars",
                                                                 "has_code", "needs", "min_score")) \
                and not self.keywords:
            raise ValueError(f"the rule for {self.model} sets no condition (use the fallback for that)")

    def why(self, request: Request, scores: dict[str, float] | None = None) -> str | None:
        """Why this rule matches ``request`` in words, or None where it does not. ``scores``: the rule's model's
        evaluated accuracy by kind of task (None: not evaluated, so ``min_score`` cannot hold)."""
        text = request.last_user_text
        reasons = []
        if self.min_chars is not None:
            if len(text) < self.min_chars:
                return None
            reasons.append(f"the message is {len(text):,} characters (at least {self.min_chars:,})")
        if self.max_chars is not None:
            if len(text) > self.max_chars:
                return None
            reasons.append(f"the message is {len(text):,} characters (at most {self.max_chars:,})")
        if self.min_context_chars is not None:
            if request.context_chars < self.min_context_chars:
                return None
            reasons.append(f"the conversation is {request.context_chars:,} characters")
        if self.has_code is not None:
            if has_code(text) != self.has_code:
                return None
            reasons.append("the message has code" if self.has_code else "the message has no code")
        if self.keywords:
            words = set(re.findall(r"[\w'-]+", text.lower()))
            found = [k for k in self.keywords if k.lower() in words or (" " in k and k.lower() in text.lower())]
            if not found:
                return None
            reasons.append(f"the message says {found[0]!r}")
        if self.needs is not None:
            if self.needs not in request.needs:
                return None
            reasons.append(f"the request needs {self.needs}")
        if self.min_score is not None:
            kind = task_kind(text)
            score = (scores or {}).get(kind)
            if score is None or score < self.min_score:
                return None
            reasons.append(f"{self.model} answered {score:.0%} of the {kind} tasks right (at least "
                           f"{self.min_score:.0%})")
        return " and ".join(reasons)

    def to_dict(self) -> dict:
        values = {k: v for k, v in dataclasses.asdict(self).items() if v not in (None, ())}
        if "keywords" in values:
            values["keywords"] = list(values["keywords"])
        return values


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request goes and why, in words (shown on the reply and returned by the endpoint)."""

    model: str
    reason: str
    rule: int | None = None  # the index of the rule that decided; None for the fallback, stickiness or a default

    def header_value(self) -> str:
        return f"{self.model}; {self.reason}"


@dataclass(slots=True)
class Routes:
    """The rules in order, and the model that answers when none matches (None: the primary)."""

    rules: list[Rule] = field(default_factory=list)
    fallback: str | None = None
    sticky: bool = True

    @classmethod
    def from_dict(cls, data: dict) -> Routes:
        """From the JSON shape; ``ValueError`` saying what is wrong."""
        if not isinstance(data, dict):
            raise ValueError("routes must be a JSON object with 'rules' and 'fallback'")
        unknown = set(data) - {"rules", "fallback", "sticky"}
        if unknown:
            raise ValueError(f"unknown field(s) in the routes: {', '.join(sorted(unknown))}")
        rules = data.get("rules", [])
        if not isinstance(rules, list):
            raise ValueError("'rules' must be a list")
        parsed = []
        for index, rule in enumerate(rules):
            if not isinstance(rule, dict):
                raise ValueError(f"rule {index + 1} must be an object")
            fields = {f.name for f in dataclasses.fields(Rule)}
            extra = set(rule) - fields
            if extra:
                raise ValueError(f"rule {index + 1}: unknown field(s) {', '.join(sorted(extra))}; "
                                 f"known: {', '.join(sorted(fields))}")
            try:
                parsed.append(Rule(**{**rule, "keywords": tuple(rule.get("keywords", ()))}))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"rule {index + 1}: {exc}") from None
        fallback = data.get("fallback")
        if fallback is not None and (not isinstance(fallback, str) or not fallback.strip()):
            raise ValueError("'fallback' must be a model's name")
        sticky = data.get("sticky", True)
        if not isinstance(sticky, bool):
            raise ValueError("'sticky' must be true or false")
        return cls(parsed, fallback, sticky)

    def to_dict(self) -> dict:
        return {"rules": [r.to_dict() for r in self.rules], "fallback": self.fallback, "sticky": self.sticky}

    @classmethod
    def default_for(cls, models: dict[str, int]) -> Routes:
        """Routes for resident ``models`` (id -> memory of their weights) when none were given: the model with
        the most weight bytes for code (attached, or asked for), long messages and questions that ask for
        reasoning; the one with the fewest (the fastest) for everything else."""
        if len(models) < 2:
            return cls([], next(iter(models), None))
        large = max(models, key=models.get)
        small = min(models, key=models.get)
        return cls([Rule(large, has_code=True), Rule(large, min_chars=600),
                    Rule(large, keywords=("code", "function", "python", "program", "script", "debug")),
                    Rule(large, keywords=("why", "explain", "prove", "calculate", "step by step", "compare"))],
                   small)


class Router:
    """Routes requests by :class:`Routes`, remembering where each conversation went (sticky routing).

    ``routes`` None: :meth:`Routes.default_for` the models resident when each request is routed."""

    def __init__(self, routes: Routes | None = None, scores: dict[str, dict[str, float]] | None = None) -> None:
        self._conversations: OrderedDict[str, str] = OrderedDict()
        self.scores = scores or {}  # model id -> kind of task -> accuracy (eval-route's; for min_score)
        self.follow(routes)

    def follow(self, routes: Routes | None) -> None:
        """Route by ``routes`` from now on (None: the default routes); where conversations ran is remembered."""
        self.given = routes is not None
        self.routes = routes if routes is not None else Routes()

    def route_on(self, engine, request: Request, fresh: bool = False) -> Decision:
        """The decision among the models resident in ``engine`` (an :class:`~engine.AsyncEngine`): a rule's model
        is any name a resident model answers to."""
        ids = engine.model_ids()
        if not self.given:  # the default routes follow the models resident now
            self.routes = Routes.default_for({i: engine.stats(i).model_memory_bytes for i in ids})

        def resolve(name: str) -> str | None:
            try:
                return engine.model_id(name)
            except LookupError:
                return None

        return self.route(request, ids, engine.model_id(), resolve, fresh)

    def route(self, request: Request, resident: list[str], primary: str, resolve=None,
              fresh: bool = False) -> Decision:
        """The decision for ``request`` among the ``resident`` model ids. ``resolve`` maps a name a rule gives to
        a resident id (None where no resident model answers to it); by default only ids match. ``fresh``: route
        again even where the conversation ran on a model before."""
        resolve = resolve or (lambda name: name if name in resident else None)
        key = request.conversation_key()
        earlier = None if fresh or not self.routes.sticky or request.is_first_turn else self._conversations.get(key)
        if earlier in resident:
            decision = Decision(earlier, f"earlier turns of this conversation ran on {earlier}")
        else:
            decision = self._by_rules(request, resolve, primary)
        self._remember(key, decision.model)
        return decision

    def keep(self, request: Request, model: str) -> None:
        """``request``'s conversation runs on ``model`` from now on (the user moved it there)."""
        self._remember(request.conversation_key(), model)

    def _remember(self, key: str, model: str) -> None:
        self._conversations[key] = model
        self._conversations.move_to_end(key)
        while len(self._conversations) > STICKY_CONVERSATIONS:
            self._conversations.popitem(last=False)

    def _by_rules(self, request: Request, resolve, primary: str) -> Decision:
        skipped = []
        for index, rule in enumerate(self.routes.rules):
            target = resolve(rule.model)
            why = rule.why(request, self.scores.get(target) if target is not None else None)
            if why is None:
                continue
            if target is not None:
                return Decision(target, why, index)
            skipped.append(rule.model)
        not_loaded = f" ({', '.join(skipped)} would have answered but is not loaded)" if skipped else ""
        fallback = resolve(self.routes.fallback) if self.routes.fallback else None
        if fallback is not None:
            return Decision(fallback, f"no rule matched: the fallback{not_loaded}")
        return Decision(primary, f"no rule matched and no fallback is loaded: the primary model{not_loaded}")
