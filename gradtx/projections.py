r"""Euclidean projections onto convex sets, for constraints applied after `apply_updates`.

Each function maps a params tree to the nearest point of a set, $\mathrm{argmin}_{y \in C}
\|x - y\|_2^2$, reading the whole tree as one vector (optax's `optax.projections`). Trees are
matched by path, `None` leaves stay `None`, and each result keeps its leaf's dtype:

    params = gradtx.apply_updates(params, updates)
    params = gradtx.projections.projection_non_negative(params)
"""

from gradtx._projections.convex_sets import (
    projection_box,
    projection_halfspace,
    projection_hypercube,
    projection_hyperplane,
    projection_l1_ball,
    projection_l1_sphere,
    projection_l2_ball,
    projection_l2_sphere,
    projection_linf_ball,
    projection_non_negative,
    projection_simplex,
    projection_vector,
)

__all__ = [
    "projection_box",
    "projection_halfspace",
    "projection_hypercube",
    "projection_hyperplane",
    "projection_l1_ball",
    "projection_l1_sphere",
    "projection_l2_ball",
    "projection_l2_sphere",
    "projection_linf_ball",
    "projection_non_negative",
    "projection_simplex",
    "projection_vector",
]
