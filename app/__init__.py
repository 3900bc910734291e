"""Kvasir's desktop application. It talks to the engine only through ``engine``'s public API."""

from .version import __version__

__all__ = ["__version__"]
