"""Per-request sampling parameters, checked when they are made so a bad value never reaches a step."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

MAX_SEED = 2**63 - 1
STRUCTURE_KINDS = ("json", "json_schema", "regex", "grammar")
MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256


@dataclass(frozen=True, slots=True)
class Structure:
    """A form a reply must take: ``kind`` "json" (any JSON object, OpenAI's json_object), "json_schema"
    (``spec``: the schema), "regex" (``spec``: the pattern) or "grammar" (``spec``: Lark or GBNF text). Sampling
    only ever picks tokens that keep the reply inside it (see :mod:`engine.step.grammar`)."""

    kind: str
    spec: str | dict | None = None

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURE_KINDS:
            raise ValueError(f"a structure's kind is one of {', '.join(STRUCTURE_KINDS)}, not {_shown(self.kind)}")
        wanted = {"json": type(None), "json_schema": dict, "regex": str, "grammar": str}[self.kind]
        if not isinstance(self.spec, wanted):
            raise ValueError(f"a {self.kind} structure needs {'no spec' if wanted is type(None) else wanted.__name__}"
                             f", not {_shown(self.spec)}")


@dataclass(slots=True)
class SamplingParams:
    """How one request picks its tokens and when it stops. ``temperature=0`` is greedy.

    Every field is checked for type and range here; a bad value raises ``ValueError`` naming the field.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # split the reply's reasoning from its answer (RequestOutput.reasoning) where the model writes any; False:
    # the text as written, markers and all (a raw completion)
    split_reasoning: bool = True
    # parse the model's tool calls out of the reply (RequestOutput.tool_calls): for a request that offered tools
    parse_tool_calls: bool = False
    structure: Structure | None = None  # the form the reply must take (structured output), None: free text

    def __post_init__(self) -> None:
        self.max_tokens = _integer("max_tokens", self.max_tokens, low=1)
        self.temperature = _real("temperature", self.temperature, low=0.0)
        self.top_p = _real("top_p", self.top_p, low=0.0, high=1.0, low_open=True)
        self.top_k = _integer("top_k", self.top_k, low=0)
        self.min_p = _real("min_p", self.min_p, low=0.0, high=1.0)
        self.repetition_penalty = _real("repetition_penalty", self.repetition_penalty, low=0.0, low_open=True)
        self.seed = None if self.seed is None else _integer("seed", self.seed, low=0, high=MAX_SEED)
        self.stop = _stop_strings(self.stop)
        self.stop_token_ids = _token_ids("stop_token_ids", self.stop_token_ids)
        for name in ("ignore_eos", "split_reasoning", "parse_tool_calls"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, not {getattr(self, name)!r}")
        if self.structure is not None and not isinstance(self.structure, Structure):
            raise ValueError(f"structure must be a Structure, not {_shown(self.structure)}")

    @property
    def greedy(self) -> bool:
        """True when the request always takes the most likely token."""
        return self.temperature == 0.0 or self.top_k == 1


def _integer(name: str, value, low: int, high: int | None = None) -> int:
    """``value`` as an int in [low, high]; floats, strings and booleans are refused, not rounded."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be a whole number, not {_shown(value)}")
    value = int(value)
    if value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"between {low} and {high}"
        raise ValueError(f"{name} must be {bound}, not {value}")
    return value


def _real(name: str, value, low: float, high: float | None = None, low_open: bool = False) -> float:
    """``value`` as a finite float within its bounds (``low_open``: ``low`` itself is excluded)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, not {_shown(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, not {value}")
    too_low = value <= low if low_open else value < low
    if too_low or (high is not None and value > high):
        raise ValueError(f"{name} must be {_range(low, high, low_open)}, not {value}")
    return value


def _range(low: float, high: float | None, low_open: bool) -> str:
    if high is None:
        return f"> {low}" if low_open else f">= {low}"
    return f"in {'(' if low_open else '['}{low}, {high}]"


def _stop_strings(stop) -> tuple[str, ...]:
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)):
        raise ValueError(f"stop must be a string or a list of strings, not {_shown(stop)}")
    if len(stop) > MAX_STOP_STRINGS:
        raise ValueError(f"stop holds {len(stop)} strings; at most {MAX_STOP_STRINGS} are allowed")
    for s in stop:
        if not isinstance(s, str):
            raise ValueError(f"stop must hold strings only, not {_shown(s)}")
        if not s or len(s) > MAX_STOP_LENGTH:
            raise ValueError(f"each stop string must be 1 to {MAX_STOP_LENGTH} characters long")
    return tuple(stop)


def _token_ids(name: str, ids) -> tuple[int, ...]:
    if not isinstance(ids, (list, tuple, set, frozenset)):
        raise ValueError(f"{name} must be a list of token ids, not {_shown(ids)}")
    return tuple(_integer(name, t, low=0) for t in ids)


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# What a chat starts with, in the app and in ``python -m engine generate|chat``. SamplingParams' own defaults are
# the OpenAI API's (temperature 1, top_p 1), which the endpoint keeps for clients that send none.
CHAT_SAMPLING = SamplingParams(max_tokens=512, temperature=0.7, top_p=0.95)
