"""The live panel: the local engine's numbers, charts and KV blocks, and a remote server's."""
