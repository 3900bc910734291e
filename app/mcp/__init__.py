"""MCP (Model Context Protocol) clients: the tools of the user's MCP servers, offered to the chats' models."""
