"""A transformation's fingerprint: a hash of its structure and static settings.

Checkpoints store it so that restoring into another optimizer (another chain, mask, flag or
state dtype) is noticed. Numeric hyperparameters are array leaves of the transformation and
are left out, so a new learning rate keeps the fingerprint, as it keeps the compiled step.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

import jax

__all__ = ["fingerprint"]

# Default reprs carry memory addresses (`<function f at 0x7f...>`), which differ between runs.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def fingerprint(tx: Any) -> str:
    """`"sha256:<hex>"` of `tx`'s tree structure, node types and static fields.

    Only class names go in, not their modules, so moving a class inside gradtx keeps the
    fingerprints of saved checkpoints.

    Examples:
        >>> fingerprint(gradtx.adam(1e-3)) == fingerprint(gradtx.adam(1e-2))
        True
        >>> fingerprint(gradtx.adam(1e-3)) == fingerprint(gradtx.adam(1e-3, nesterov=True))
        False
    """
    text = _describe(jax.tree_util.tree_structure(tx))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _describe(treedef: Any) -> str:
    # A walk of our own rather than `str(treedef)`, whose layout may change between JAX versions.
    children = treedef.children()
    if not children and treedef.num_leaves == 1:
        return "*"
    kind, data = treedef.node_data()
    static = _ADDRESS.sub("", repr(data))
    return f"{kind.__qualname__}[{static}]({','.join(_describe(c) for c in children)})"
