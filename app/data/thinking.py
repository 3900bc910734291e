"""A chat's "Think before answering" switch: the one rule for what it asks of the model's chat template. No Qt.

It matters only for a model whose template can be asked not to think (``EngineStats.thinking_switch``); other
templates ignore the option, so it is sent whatever the model.
"""

from __future__ import annotations

THINK = "think"  # a chat's setting: False asks the model to answer without reasoning first; absent: it thinks
OFF = {"enable_thinking": False}  # the template variable Qwen3-style templates read


def thinks(settings: dict) -> bool:
    """Whether a chat with ``settings`` lets the model think before answering (the default)."""
    return settings.get(THINK) is not False


def template_options(settings: dict) -> dict:
    """The chat template options a chat's prompt goes with."""
    return {} if thinks(settings) else dict(OFF)
