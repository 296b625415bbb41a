"""Layer 2, storage layouts: packed buffers, complex leaves as real pairs, grouped step counts."""
