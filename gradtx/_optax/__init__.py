"""Layer 4, optax interop: optax transformations inside gradtx combinators, states by name."""
