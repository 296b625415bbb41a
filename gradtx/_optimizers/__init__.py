"""Layer 7, optimizers: the familiar names, each a short chain of transformations."""
