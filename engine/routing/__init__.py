"""Model routing: which resident model answers a message, by rules over what is known before generating."""
