"""A model's chat template: its Jinja source and the variables it is rendered with, run in the sandbox."""

from __future__ import annotations

from ..errors import ModelLoadError
from .sandbox import SandboxError, TemplateError, TemplateLimitError, TemplateSandbox, shared_sandbox

SAMPLE_CHATS = (  # what every chat template meets at once; one that cannot render them in its limits is refused
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hello!"},
     {"role": "assistant", "content": "Hi! How can I help?"}, {"role": "user", "content": "Tell me a story."}],
)
SAMPLE_MAX_CHARS = 1024**2


class ChatTemplate:
    """Renders chats with a tokenizer's template, as ``tokenizer.apply_chat_template`` would, but in the sandbox."""

    def __init__(self, tokenizer, sandbox: TemplateSandbox | None = None) -> None:
        self.source: str = tokenizer.get_chat_template()  # a template per purpose resolves to the default one
        self.variables = {name: value for name, value in tokenizer.special_tokens_map.items()
                          if isinstance(value, (str, list))}
        self.sandbox = sandbox or shared_sandbox()

    def render(self, messages: list[dict], max_chars: int, options: dict | None = None,
               tools: list[dict] | None = None) -> str:
        """The chat as text, ready for the model to write the next assistant message. A final assistant message
        is continued, not closed (a reply cut short is written on). ``options``: more variables for the template
        (``enable_thinking``, say); ``tools``: the functions it lays out."""
        continuing = messages[-1]["role"] == "assistant"
        variables = {**self.variables, **options} if options else self.variables
        return self.sandbox.render(self.source, messages, variables=variables,
                                   add_generation_prompt=not continuing, continue_final_message=continuing,
                                   max_chars=max_chars, tools=tools)

    def check(self, model_name: str) -> None:
        """Render the sample chats once: a template that breaks a limit on them is refused with
        :class:`ModelLoadError`. One that merely refuses a sample (no system role, say) is left to each request."""
        for chat in SAMPLE_CHATS:
            try:
                self.render(chat, SAMPLE_MAX_CHARS)
            except TemplateLimitError as exc:
                raise ModelLoadError(f"{model_name} can't be used: {exc} for a {len(chat)}-message chat") from None
            except SandboxError as exc:
                raise ModelLoadError(f"{model_name} can't be used: {exc}") from None
            except TemplateError:
                pass
