"""What the app keeps: the chat store, settings, personas, remote servers, export. No Qt in here but the
models' signals."""
