"""Request bodies of ``/v1/chat/completions`` and ``/v1/completions``, checked and turned into a prompt and
:class:`SamplingParams`. A field that is wrong, or that asks for something this engine lacks, is a 400 naming
it; fields that change nothing here (``user``, ``metadata``, ...) are accepted and ignored, as OpenAI's own
server treats them for a model that has no use for them."""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass

from ..sampling_params import MAX_SEED, SamplingParams, Structure
from ..serving.prompt_encoder import Chat, checked_options
from .errors import bad_field, shown
from .tool_fields import ToolChoice, assistant_calls, tool_choice_of, tool_message, tools_of

CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions; chat defaults to the context left
MAX_CHOICES = 16  # n: replies to one prompt, each its own request in the same batch

# OpenAI name -> SamplingParams field. top_k, min_p, repetition_penalty, ignore_eos and stop_token_ids are the
# extensions vLLM and llama.cpp's server also take.
SAMPLING_FIELDS = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "repetition_penalty": "repetition_penalty", "seed": "seed", "stop": "stop", "ignore_eos": "ignore_eos",
    "stop_token_ids": "stop_token_ids",
}
IGNORED_FIELDS = frozenset({
    "user", "metadata", "store", "service_tier", "parallel_tool_calls", "reasoning_effort", "verbosity",
    "prompt_cache_key", "prompt_cache_retention", "safety_identifier",
})
# Fields accepted only at the value that means "nothing asked for"; anything else is refused, with why.
NOTHING_ASKED = {
    "best_of": (lambda v: v == 1, "only best_of=1 is supported"),
    "frequency_penalty": (lambda v: v == 0, "frequency_penalty is not supported; use repetition_penalty"),
    "presence_penalty": (lambda v: v == 0, "presence_penalty is not supported; use repetition_penalty"),
    "logit_bias": (lambda v: v == {}, "logit_bias is not supported"),
    "logprobs": (lambda v: v is False, "logprobs are not supported"),
    "top_logprobs": (lambda v: v == 0, "top_logprobs is not supported"),
    "functions": (lambda v: v == [], "the deprecated functions field is not supported; use tools"),
    "function_call": (lambda v: v in ("none", "auto"), "the deprecated function_call is not supported; use "
                                                       "tool_choice"),
    "modalities": (lambda v: v == ["text"], "only text output is supported"),
    "audio": (lambda v: False, "audio output is not supported"),
    "prediction": (lambda v: False, "predicted outputs are not supported"),
    "web_search_options": (lambda v: False, "web search is not supported"),
    "suffix": (lambda v: v == "", "suffix (insertion) is not supported"),
    "echo": (lambda v: v is False, "echo is not supported"),
}
COMMON_FIELDS = {"model", "stream", "stream_options", "max_tokens", *SAMPLING_FIELDS, *IGNORED_FIELDS}
CHAT_FIELDS = frozenset({*COMMON_FIELDS, "messages", "max_completion_tokens", "n", "frequency_penalty",
                         "presence_penalty", "logit_bias", "logprobs", "top_logprobs", "tools", "functions",
                         "tool_choice", "function_call", "response_format", "modalities", "audio", "prediction",
                         "web_search_options", "chat_template_kwargs", "guided_regex", "guided_grammar"})
COMPLETION_FIELDS = frozenset({*COMMON_FIELDS, "prompt", "n", "best_of", "frequency_penalty", "presence_penalty",
                               "logit_bias", "logprobs", "suffix", "echo"})
OPENAI_RANGES = {"temperature": (0.0, 2.0), "frequency_penalty": (-2.0, 2.0), "presence_penalty": (-2.0, 2.0)}


@dataclass(frozen=True, slots=True)
class ApiRequest:
    """A checked request: what to prompt the engine with and how to sample, before its length is known."""

    kind: str  # "chat" | "completion"
    model: str
    prompt: str | list[int] | Chat
    prompt_field: str  # the field the prompt came from, for errors about its length
    sampling: dict  # SamplingParams fields other than max_tokens, each already checked
    max_tokens: int | None  # None: the default for this kind
    max_tokens_field: str  # "max_tokens" or "max_completion_tokens"
    stream: bool
    include_usage: bool
    n: int = 1
    tool_choice: ToolChoice = ToolChoice()
    structure_field: str = "response_format"  # the field the reply's required form came from, for its errors

    def sampling_params(self, max_tokens: int, choice: int = 0, structure: Structure | None = None) -> SamplingParams:
        """The sampling of reply ``choice``: with a seed, each reply has its own (seed + choice), so the ``n``
        replies differ and each is reproducible. ``structure``: the form a forced tool call takes."""
        seed = self.sampling.get("seed")
        values = self.sampling if seed is None else {**self.sampling, "seed": (seed + choice) % (MAX_SEED + 1)}
        if structure is not None:
            values = {**values, "structure": structure}
        # a chat's reasoning comes apart from its answer (reasoning_content); a completion is the text as written
        return SamplingParams(max_tokens=max_tokens, split_reasoning=self.kind == "chat",
                              parse_tool_calls=self.tool_choice.offered, **values)


def parse_chat(body: dict) -> ApiRequest:
    """A ``/v1/chat/completions`` body; raises :class:`ApiError` (400) naming the field at fault."""
    present = _present(body, CHAT_FIELDS)
    tools = tools_of(present)
    choice = tool_choice_of(present, tools)
    chat = Chat(chat_messages(_required(body, "messages")), _template_options(present),
                tools if choice.offered else [])
    field = "max_completion_tokens" if "max_completion_tokens" in present else "max_tokens"
    request = _request("chat", body, present, chat, "messages", field)
    structure, structure_field = _structure(present)
    if choice.forced and structure is not None:
        raise bad_field("tool_choice", f"a forced tool call and {structure_field} cannot both shape the reply")
    sampling = request.sampling if structure is None else {**request.sampling, "structure": structure}
    return dataclasses.replace(request, sampling=sampling, tool_choice=choice,
                               structure_field="tool_choice" if choice.forced else structure_field)


def _structure(present: dict) -> tuple[Structure | None, str]:
    """The form the reply must take: ``response_format`` (json_object, json_schema), or vLLM's ``guided_regex``
    and ``guided_grammar`` (Lark); with the field it came from."""
    for name, kind in (("guided_regex", "regex"), ("guided_grammar", "grammar")):
        if name in present:
            if not isinstance(present[name], str) or not present[name]:
                raise bad_field(name, f"{name} must be a non-empty string")
            return Structure(kind, present[name]), name
    form = present.get("response_format", {"type": "text"})
    kind = form.get("type") if isinstance(form, dict) else None
    if kind == "text":
        return None, "response_format"
    if kind == "json_object":
        return Structure("json"), "response_format"
    schema = form.get("json_schema", {}).get("schema") if isinstance(form.get("json_schema"), dict) else None
    if kind == "json_schema" and isinstance(schema, dict):
        return Structure("json_schema", schema), "response_format"
    raise bad_field("response_format", "response_format must be {'type': 'text'}, {'type': 'json_object'} or "
                                       "{'type': 'json_schema', 'json_schema': {'name': ..., 'schema': {...}}}, not "
                                       f"{shown(form)}")


def _template_options(present: dict) -> dict:
    """``chat_template_kwargs`` (vLLM's and llama-server's name): more variables for the model's chat template,
    such as ``{"enable_thinking": false}``."""
    try:
        return checked_options(present.get("chat_template_kwargs", {}))
    except ValueError as exc:
        raise bad_field("chat_template_kwargs", str(exc)) from None


def parse_completion(body: dict) -> ApiRequest:
    """A ``/v1/completions`` body; raises :class:`ApiError` (400) naming the field at fault."""
    present = _present(body, COMPLETION_FIELDS)
    prompt = completion_prompt(_required(body, "prompt"))
    return _request("completion", body, present, prompt, "prompt", "max_tokens")


def _request(kind: str, body: dict, present: dict, prompt, prompt_field: str, tokens_field: str) -> ApiRequest:
    model = _required(body, "model")
    if not isinstance(model, str) or not model:
        raise bad_field("model", "model must be the name of a model (see GET /v1/models)")
    _refuse_what_is_missing(present)
    stream = _boolean(present, "stream")
    return ApiRequest(kind, model, prompt, prompt_field, _sampling(present), _max_tokens(present, tokens_field),
                      tokens_field, stream, _include_usage(present, stream), _choices(present))


def _present(body: dict, known: frozenset[str]) -> dict:
    """The fields given a value (null means "the default", as in OpenAI's API); an unknown field is a 400."""
    for name in body:
        if name not in known:
            raise bad_field(name, f"Unrecognized request argument supplied: {shown(name)}")
    return {name: value for name, value in body.items() if value is not None}


def _required(body: dict, name: str):
    if body.get(name) is None:
        raise bad_field(name, f"you must provide {name}")
    return body[name]


def _refuse_what_is_missing(present: dict) -> None:
    for name, (nothing_asked, why) in NOTHING_ASKED.items():
        if name in present:
            value = present[name]
            _in_openai_range(name, value)
            if not nothing_asked(value):
                raise bad_field(name, f"{why} (got {shown(value)})", code="unsupported_parameter")


def _sampling(present: dict) -> dict:
    """SamplingParams fields from the request, each checked by the engine's own rules (the message names the
    field)."""
    values = {}
    for name, field in SAMPLING_FIELDS.items():
        if name not in present:
            continue
        value = present[name]
        if name == "top_k" and value == -1:
            value = 0  # vLLM's spelling of "off"
        _in_openai_range(name, value)
        try:
            SamplingParams(**{field: value})
        except (ValueError, TypeError) as exc:
            raise bad_field(name, str(exc)) from None
        values[field] = value
    return values


def _in_openai_range(name: str, value) -> None:
    """OpenAI's own bounds, where they are tighter than the engine's (temperature up to 2, say)."""
    if name in OPENAI_RANGES and _is_number(value):
        low, high = OPENAI_RANGES[name]
        if not low <= value <= high:
            raise bad_field(name, f"{name} must be between {low:g} and {high:g}, not {shown(value)}")
    elif name in OPENAI_RANGES:
        raise bad_field(name, f"{name} must be a number, not {shown(value)}")
    elif name in ("best_of", "top_logprobs") and not _is_whole(value):
        raise bad_field(name, f"{name} must be a whole number, not {shown(value)}")


def _choices(present: dict) -> int:
    value = present.get("n", 1)
    if not _is_whole(value) or not 1 <= value <= MAX_CHOICES:
        raise bad_field("n", f"n must be a whole number from 1 to {MAX_CHOICES}, not {shown(value)}")
    return int(value)


def _max_tokens(present: dict, field: str) -> int | None:
    if field not in present:
        return None
    value = present[field]
    if not _is_whole(value) or value < 1:
        raise bad_field(field, f"{field} must be a whole number >= 1, not {shown(value)}")
    return int(value)


def _boolean(present: dict, name: str) -> bool:
    value = present.get(name, False)
    if not isinstance(value, bool):
        raise bad_field(name, f"{name} must be true or false, not {shown(value)}")
    return value


def _include_usage(present: dict, stream: bool) -> bool:
    options = present.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise bad_field("stream_options", "stream_options is only allowed when stream is true")
    if not isinstance(options, dict):
        raise bad_field("stream_options", f"stream_options must be an object, not {shown(options)}")
    usage = options.get("include_usage", False)
    if usage is not None and not isinstance(usage, bool):
        raise bad_field("stream_options.include_usage", f"include_usage must be true or false, not {shown(usage)}")
    return bool(usage)


def chat_messages(value) -> list[dict]:
    """``messages`` as the engine takes them: role and text content; content parts are joined."""
    if not isinstance(value, list) or not value:
        raise bad_field("messages", "messages must be a non-empty list of messages")
    return [_message(i, m) for i, m in enumerate(value)]


def _message(index: int, message) -> dict:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise bad_field(where, f"{where} must be an object with a role and a content, not {shown(message)}")
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise bad_field(f"{where}.role", f"{where}.role must be one of {', '.join(CHAT_ROLES)}, not {shown(role)}")
    calls = message.get("tool_calls") if role == "assistant" else None
    content = message.get("content")
    text = "" if content is None and calls is not None else _content(content, f"{where}.content")
    if role == "tool":
        return tool_message(index, message, text)
    checked = {"role": CHAT_ROLES[role], "content": text}
    if calls is not None:
        checked["tool_calls"] = assistant_calls(index, calls)
    reasoning = message.get("reasoning_content")
    if reasoning is not None and role == "assistant":  # an earlier reply's reasoning: the template decides
        if not isinstance(reasoning, str):
            raise bad_field(f"{where}.reasoning_content", f"{where}.reasoning_content must be a string")
        checked["reasoning_content"] = reasoning
    return checked


def _content(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_field(f"{where}[{i}]", f"{where}[{i}] must be a text part ({{'type': 'text', 'text': ...}}); "
                                                 "this model reads text only")
            texts.append(part["text"])
        return "\n".join(texts)
    raise bad_field(where, f"{where} must be a string or a list of text parts, not {shown(content)}")


def completion_prompt(value) -> str | list[int]:
    """``prompt``: a string or token ids, alone or as a list of one (one prompt per request)."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(_is_whole(t) for t in value):
        return [int(t) for t in value]
    if isinstance(value, list) and len(value) > 1 and all(isinstance(p, (str, list)) for p in value):
        raise bad_field("prompt", "this server takes one prompt per request; send the others separately")
    raise bad_field("prompt", f"prompt must be a string or a list of token ids, not {shown(value)}")


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _is_whole(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)

