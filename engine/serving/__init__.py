"""The serving core: requests in, streamed outputs out. The engine and its thread, the scheduler, the block
manager of the paged KV cache, per-request state and metrics."""
