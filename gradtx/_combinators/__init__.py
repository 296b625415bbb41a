"""Layer 4, combinators: transformations built from other transformations."""
