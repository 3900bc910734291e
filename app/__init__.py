"""Kvasir's desktop application. It talks to the engine only through ``engine``'s public API."""

__version__ = "0.1.0"
