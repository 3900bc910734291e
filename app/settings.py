"""User settings (defaults merged with the saved file) and the system-prompt presets. No Qt in here."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

DEFAULTS = {
    "theme": "system",  # "system" | "light" | "dark"
    "model": "default",
    "quantization": "auto",
    "preset": "Helpful assistant",
    "sampling": {"temperature": 0.7, "top_p": 0.95, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0,
                 "max_tokens": 512, "seed": None},
}
SAMPLING_KEYS = tuple(DEFAULTS["sampling"])


@dataclass(frozen=True, slots=True)
class Preset:
    name: str
    system_prompt: str


def assets_dir() -> Path:
    """The shipped assets: beside the package in a source tree, or bundled next to the frozen app."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent / "assets", here / "assets"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("the assets folder is missing from this installation")


def load_presets() -> list[Preset]:
    data = json.loads((assets_dir() / "presets.json").read_text(encoding="utf-8"))
    return [Preset(p["name"], p["system_prompt"]) for p in data["presets"]]


def config_dir() -> Path:
    override = os.environ.get("KVASIR_CONFIG_DIR") or os.environ.get("KVASIR_DATA_DIR")
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_config_dir("Kvasir", appauthor=False))


class Settings:
    """``settings["theme"]`` etc.: the saved value, or the default. ``save()`` writes the file."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or config_dir() / "settings.json"
        self.values = json.loads(json.dumps(DEFAULTS))
        if self.path.is_file():
            try:
                saved = json.loads(self.path.read_text(encoding="utf-8"))
            except ValueError:
                saved = {}  # a damaged file falls back to the defaults rather than stopping the app
            for key, value in saved.items():
                if key == "sampling" and isinstance(value, dict):
                    self.values["sampling"].update({k: v for k, v in value.items() if k in SAMPLING_KEYS})
                elif key in DEFAULTS:
                    self.values[key] = value

    def __getitem__(self, key: str):
        return self.values[key]

    def __setitem__(self, key: str, value) -> None:
        if key not in DEFAULTS:
            raise KeyError(key)
        self.values[key] = value

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.values, indent=2), encoding="utf-8")
        tmp.replace(self.path)
