"""The chat on screen: its list model (the live reply's one owner), the view bound to it, Markdown."""
