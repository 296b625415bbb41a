"""Per-example gradients made from one gradient, for the methods that take a batch of them.

The contract passes one gradient; `FromOneGradient` makes it into a batch of scaled copies
(`EXAMPLE_SCALES`) before the inner transformation sees it, and `on_examples` feeds a
reference the same batch.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import references as ref

import gradtx

# Example i's gradient is EXAMPLE_SCALES[i] * g: norms |g|, |g| / 2, 3 |g| and a zero example
# (no negative scale: a sum that cancels would lose the precision the oracle check asks for).
EXAMPLE_SCALES = (1.0, 0.5, 3.0, 0.0)


def as_examples(grads: Any) -> Any:
    """A batch of per-example gradients (leading axis) made from one gradient tree."""

    def stack(g: Any) -> Any:
        return jnp.stack([(s * g.astype(jnp.float32)).astype(g.dtype) for s in EXAMPLE_SCALES])

    return jax.tree.map(stack, grads)


class FromOneGradient(gradtx.Transformation):
    """Runs `inner` (which takes per-example gradients) on `as_examples(updates)`."""

    name: ClassVar[str] = "from_one_gradient"
    inner: Any = None

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        return self.inner.update(as_examples(updates), state, params, **extra)


def on_examples(inner: ref.Reference) -> ref.Reference:
    """A per-example reference fed the batch that `FromOneGradient` makes of one gradient."""

    def update(grads: dict, state: dict, params: dict) -> tuple[dict, dict]:
        examples = {
            p: np.stack([s * np.asarray(g) for s in EXAMPLE_SCALES]) for p, g in grads.items()
        }
        return inner.update(examples, state, params)

    return ref.Reference(inner.init, update)
