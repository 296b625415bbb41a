"""Layer 6, state tools: flat views, loading, reconciling, hyperparameters by name, explain."""
