"""Errors the engine raises with a message meant for the user."""


class EngineError(Exception):
    """Base class: something the user can act on, said in words."""


class ModelLoadError(EngineError):
    """The model could not be found, read or loaded."""


class UnsupportedModelError(ModelLoadError):
    """The model loads, but the engine can't serve it correctly."""
