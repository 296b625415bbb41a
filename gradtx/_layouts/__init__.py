"""Storage layouts: packed buffers, complex leaves as real pairs, grouped per-path step counts."""
