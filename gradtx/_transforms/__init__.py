"""Layer 3, transformations: per-array math, one module per family."""
