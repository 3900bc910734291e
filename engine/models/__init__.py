"""Model files: where a model comes from, what its files hold and whether they agree, whether it fits, loading
it, and the user's library of models."""
