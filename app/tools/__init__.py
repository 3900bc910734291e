"""Tools that run the real window offscreen: ``make screenshots`` and the UI benchmark."""
