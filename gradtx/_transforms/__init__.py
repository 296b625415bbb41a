"""Layer 5, transformations: per-array math, one module per family."""
