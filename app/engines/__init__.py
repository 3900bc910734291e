"""What replies: the local engine's bridge, remote servers, the local API, token counting."""
