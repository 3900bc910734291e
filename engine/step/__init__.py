"""The model step: one forward pass over a packed batch (runner, paged attention), sampling, detokenising, and
the quantised layers the weights run through."""
