"""Files the app reads at run time, shipped as package data and found through importlib.resources."""
