"""Tools built on the public API: the command line, the benchmark and the quantisation evaluation."""
