"""The dialogs: chat settings, preferences, the model manager and Discover, remote servers, shortcuts, about."""
