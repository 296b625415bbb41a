"""Layer 5, projections: the nearest point of a convex set to a params tree read as one vector."""
