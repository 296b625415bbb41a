"""Layer 6, combinators: transformations built from other transformations."""
