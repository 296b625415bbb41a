"""Layer 4, tree maths: the path-matched arithmetic, reductions and access of `gradtx.tree`."""
