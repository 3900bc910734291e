"""The main window and its parts: the model bar, the sidebar, the banner, the composer, the commands."""
