"""Layer 8, state tools: flat views, loading, reconciling, hyperparameters by name, explain."""
