"""Chat templates, rendered in a separate process with time, memory and size limits (a model's template is code
from a file the user downloaded: it must never hang or exhaust the engine)."""
