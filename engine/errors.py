"""Errors the engine raises with a message meant for the user."""


class EngineError(Exception):
    """Base class: something the user can act on, said in words."""


class EngineDeadError(EngineError):
    """The engine thread has stopped; no request can be served until it is started again."""


class ModelLoadError(EngineError):
    """The model could not be found, read or loaded."""


class UnsupportedModelError(ModelLoadError):
    """The model loads, but the engine can't serve it correctly."""


class LibraryError(ModelLoadError):
    """The model library's index (library.json) is damaged; it is left as it is until moved aside."""


class HubError(EngineError):
    """The Hugging Face Hub could not be searched or downloaded from (the network, the server, access)."""


class DownloadCancelled(HubError):
    """A download was cancelled; what arrived is kept, and the next download of the file continues from it."""


class PromptTooLong(ValueError):
    """A prompt holds more than the model's context can: refused before it is templated or tokenised."""
