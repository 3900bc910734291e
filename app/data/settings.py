"""User settings (defaults merged with the saved file) and the system-prompt presets. No Qt in here."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from engine import (
    CHAT_SAMPLING,
    DEFAULT_API_HOST,
    DEFAULT_API_PORT,
    KV_CACHE_DTYPES,
    SPECULATION_MODES,
    EngineConfig,
    SamplingParams,
)
from engine.models.draft_candidates import DRAFT_QUANTIZATION
from engine.routing.router import Routes

from .mcp_servers import DEFAULT_TOOL_TIMEOUT_S, MAX_TOOL_TIMEOUT_S, valid_servers

log = logging.getLogger(__name__)

# what a chat's settings may set, in the order the dialogs show them
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens", "seed")
DEFAULTS = {
    "theme": "system",  # "system" | "light" | "dark"
    "model": "default",  # the model, quantisation and device that served last: the next start opens on them
    "quantization": "auto",
    "device": "auto",
    "preset": "Helpful assistant",
    "text_scale": 100,  # percent: the transcript's and the message box's text size (Ctrl+= / Ctrl+- / Ctrl+0)
    "sampling": {key: getattr(CHAT_SAMPLING, key) for key in SAMPLING_KEYS},  # the engine's chat defaults
    "threads": "auto",  # the engine's CPU threads: "auto" (as many as other programs leave cores) or a count
    "lower_priority": False,  # the engine's threads yield to other programs that need the CPU
    "kv_cache_dtype": "auto",  # how the KV cache stores keys and values (engine.KV_CACHE_DTYPES); a change reloads
    "kv_disk_cache": True,  # recent conversations' KV blocks kept on disk, read back after a restart
    "speculation": "auto",  # speculative decoding (APP_SPECULATION_MODES); applied at once, no reload
    "highlight_drafts": False,  # View > Highlight drafted words: replies' words that came from kept drafts
    # per model and quantisation (draft_key): the model loaded beside it, as int4, to write drafts (auto uses them
    # where they pay; the model bar offers the ones that can); a change reloads
    "drafts": {},
    # a resident model other than the first that no chat has used for this many minutes is unloaded (0: never)
    "idle_unload_minutes": 0,
    # the rules that pick the model of a chat set to "Auto (routed)" (engine.routing.router.Routes.to_dict); None:
    # the default routes for the models resident at the time (Models > Routing edits them)
    "routes": None,
    # The local OpenAI-compatible endpoint: off until the user turns it on in Preferences.
    "api": {"enabled": False, "host": DEFAULT_API_HOST, "port": DEFAULT_API_PORT, "api_key": ""},
    # MCP servers whose tools chats may call (app.data.mcp_servers.McpServer.to_dict), and how long a call may take
    "mcp_servers": [],
    "tool_timeout_s": DEFAULT_TOOL_TIMEOUT_S,
}
API_CHECKS = {
    "enabled": lambda v: isinstance(v, bool),
    "host": lambda v: isinstance(v, str) and bool(v.strip()),
    "port": lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 65535,
    "api_key": lambda v: isinstance(v, str),
}
THEMES = ("system", "light", "dark")
MAX_THREADS = 1024
MAX_IDLE_MINUTES = 24 * 60
TEXT_SCALES = (50, 67, 75, 80, 90, 100, 110, 125, 150, 175, 200, 250, 300)  # the steps of Ctrl+= and Ctrl+-


class SettingsError(ValueError):
    """settings.json can't be read as settings at all (not JSON, or not an object); the message says why."""


def sampling_problems(values: dict) -> dict[str, str]:
    """The sampling settings in ``values`` that the engine would refuse, each with the engine's reason."""
    problems = {}
    for key in SAMPLING_KEYS:
        if key in values:
            try:
                SamplingParams(**{key: values[key]})  # the engine owns the rules; ask it, one field at a time
            except (ValueError, TypeError) as exc:
                problems[key] = str(exc) if key in str(exc) else f"{key}: {exc}"
    if not problems:
        try:
            SamplingParams(**{k: v for k, v in values.items() if k in SAMPLING_KEYS})
        except (ValueError, TypeError) as exc:
            problems["sampling"] = str(exc)
    return problems


def valid_sampling(values: dict) -> dict:
    """``values`` with every setting the engine would refuse put back to its default (a warning is logged)."""
    problems = sampling_problems(values)
    for key, reason in problems.items():
        log.warning("ignoring the sampling setting %s=%r: %s", key, values.get(key), reason)
    if "sampling" in problems:
        return dict(DEFAULTS["sampling"])
    return {**values, **{key: DEFAULTS["sampling"][key] for key in problems}}


def next_text_scale(current: int, step: int) -> int:
    """The text scale one step larger (``step`` 1) or smaller (-1) than ``current``, within the steps' range."""
    if step > 0:
        return next((s for s in TEXT_SCALES if s > current), TEXT_SCALES[-1])
    return next((s for s in reversed(TEXT_SCALES) if s < current), TEXT_SCALES[0])


@dataclass(frozen=True, slots=True)
class Preset:
    """A persona: a name and its system prompt. Built-in ones ship in ``app/assets/presets.json`` and can't be
    changed; the user's own are stored in the chat database."""

    name: str
    system_prompt: str
    builtin: bool = True


def load_presets() -> list[Preset]:
    """The system-prompt presets shipped in app/assets/presets.json."""
    from ..resources import asset

    data = json.loads(asset("presets.json").read_text(encoding="utf-8"))
    return [Preset(p["name"], p["system_prompt"]) for p in data["presets"]]


def config_dir() -> Path:
    override = os.environ.get("KVASIR_CONFIG_DIR") or os.environ.get("KVASIR_DATA_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_config_dir("Kvasir", appauthor=False))


class Settings:
    """``settings["theme"]`` etc.: the saved value, or the default. ``save()`` writes the file.

    A file that is not a JSON object raises :class:`SettingsError` (the app offers to move it aside); a single
    bad value falls back to its default with a logged warning."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or config_dir() / "settings.json"
        self.values = json.loads(json.dumps(DEFAULTS))
        if self.path.is_file():
            self._merge(_read_object(self.path))

    def _merge(self, saved: dict) -> None:
        for key, value in saved.items():
            if key == "drafts" and isinstance(value, dict):
                self.values["drafts"].update(self._valid_drafts(value))
            elif key == "sampling" and isinstance(value, dict):
                known = {k: v for k, v in value.items() if k in SAMPLING_KEYS}
                self.values["sampling"].update(valid_sampling(known))
            elif key == "api" and isinstance(value, dict):
                self.values["api"].update(self._valid_api(value))
            elif key == "mcp_servers":
                self.values["mcp_servers"] = valid_servers(value)
            elif key == "routes":
                self.values["routes"] = self._valid_routes(value)
            elif key in DEFAULTS and _valid_value(key, value):
                self.values[key] = value
            elif key in DEFAULTS:
                log.warning("ignoring the setting %s=%r in %s: not a valid value", key, value, self.path)
        if saved.get("self_draft") is True:  # an earlier version's "the chat's model drafts for itself"
            model = self.values["model"]
            self.values["drafts"].setdefault(draft_key(model, self.values["quantization"]), model)

    def _valid_drafts(self, saved: dict) -> dict:
        """The draft choices that name a model; the others are dropped (with a logged warning)."""
        kept = {}
        for model, draft in saved.items():
            if isinstance(draft, str) and draft.strip():
                kept[model] = draft
            else:
                log.warning("ignoring the draft model %r for %s in %s: not a model", draft, model, self.path)
        return kept

    def _valid_routes(self, saved) -> dict | None:
        """Routes the router can follow, or None (the default routes) with a logged warning saying why not."""
        if saved is None:
            return None
        try:
            return Routes.from_dict(saved).to_dict()
        except ValueError as exc:
            log.warning("ignoring the routes in %s: %s", self.path, exc)
            return None

    def _valid_api(self, saved: dict) -> dict:
        """The endpoint settings of the right type; the others keep their defaults (with a logged warning)."""
        kept = {}
        for key, value in saved.items():
            if key in API_CHECKS and API_CHECKS[key](value):
                kept[key] = value
            else:
                log.warning("ignoring the setting api.%s=%r in %s: not a valid value", key, value, self.path)
        return kept

    def __getitem__(self, key: str):
        return self.values[key]

    def __setitem__(self, key: str, value) -> None:
        if key not in DEFAULTS:
            raise KeyError(key)
        self.values[key] = value

    def save(self) -> None:
        """Write the file atomically, readable by the user only."""
        _private_folder(self.path.parent)
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(json.dumps(self.values, indent=2))
        if os.name == "posix":
            os.chmod(tmp, 0o600)  # an older .tmp left behind may have had wider permissions
        tmp.replace(self.path)


def idle_unload_s(settings) -> float | None:
    """How long a resident model may go unused before it is unloaded, in seconds (None: never)."""
    minutes = settings["idle_unload_minutes"]
    return minutes * 60.0 if minutes else None


def engine_cpu_options(settings) -> dict:
    """The engine's CPU settings as :class:`engine.EngineConfig` takes them."""
    threads = settings["threads"]
    return {"threads": None if threads == "auto" else threads, "lower_priority": settings["lower_priority"]}


LOAD_SETTINGS = ("kv_cache_dtype", "kv_disk_cache")  # Preferences' settings the engine takes only at a load
# the modes Preferences offers: a draft model is chosen in the model bar, and auto uses it
APP_SPECULATION_MODES = tuple(mode for mode in SPECULATION_MODES if mode != "draft")


def engine_load_options(settings, model: str, quantization: str) -> dict:
    """Every setting that an :class:`engine.EngineConfig` for ``model`` in ``quantization`` takes besides those
    two: the CPU ones, the KV cache's format and disk tier, speculative decoding's mode, and the draft model."""
    return {**engine_cpu_options(settings), **{key: settings[key] for key in LOAD_SETTINGS},
            "speculation": settings["speculation"], **draft_options(settings, model, quantization)}


def local_config(settings, model: str, quantization: str) -> EngineConfig:
    """The configuration that loads ``model`` in ``quantization`` with every other setting as the user set it."""
    return EngineConfig(model=model, quantization=quantization, device=settings["device"],
                        **engine_load_options(settings, model, quantization))


def routes_of(settings) -> Routes | None:
    """The routing rules the user set (None: the default routes for the resident models)."""
    return Routes.from_dict(settings["routes"]) if settings["routes"] is not None else None


def draft_key(model: str, quantization: str) -> str:
    """Where the ``drafts`` setting keeps the draft of ``model`` in ``quantization``: "default@none"."""
    return f"{model}@{quantization}"


def with_draft(drafts: dict, model: str, quantization: str, draft: str | None) -> dict:
    """The ``drafts`` setting with ``draft`` as the draft of ``model`` in ``quantization`` (None: no draft)."""
    key = draft_key(model, quantization)
    kept = {name: value for name, value in drafts.items() if name != key}
    return {**kept, key: draft} if draft else kept


def draft_options(settings, model: str, quantization: str) -> dict:
    """The draft model chosen for ``model`` in ``quantization`` (None: none), as an EngineConfig takes it."""
    return {"draft_model": settings["drafts"].get(draft_key(model, quantization)),
            "draft_quantization": DRAFT_QUANTIZATION}


def _read_object(path: Path) -> dict:
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SettingsError(f"it is not readable JSON ({exc})") from None
    except RecursionError:
        raise SettingsError("it nests its values too deep to be settings") from None
    if not isinstance(saved, dict):
        raise SettingsError(f"it holds a JSON {type(saved).__name__}, not an object of settings")
    return saved


def _valid_value(key: str, value) -> bool:
    """Whether a top-level setting has a usable type (sampling is checked by the engine's rules)."""
    if key == "theme":
        return value in THEMES
    if key == "text_scale":
        return type(value) is int and TEXT_SCALES[0] <= value <= TEXT_SCALES[-1]
    if key == "threads":
        return value == "auto" or (type(value) is int and 1 <= value <= MAX_THREADS)
    if key == "lower_priority":
        return isinstance(value, bool)
    if key == "idle_unload_minutes":
        return type(value) is int and 0 <= value <= MAX_IDLE_MINUTES
    if key == "kv_cache_dtype":
        return value in KV_CACHE_DTYPES
    if key == "tool_timeout_s":
        return type(value) in (int, float) and 0 < value <= MAX_TOOL_TIMEOUT_S
    if key in ("kv_disk_cache", "highlight_drafts"):
        return isinstance(value, bool)
    if key == "speculation":
        return value in APP_SPECULATION_MODES
    if key in ("sampling", "api"):
        return False  # a dict is merged key by key above; anything else is not these settings
    return isinstance(value, str) and bool(value)


def _private_folder(folder: Path) -> None:
    if not folder.exists():
        folder.mkdir(parents=True, mode=0o700)
