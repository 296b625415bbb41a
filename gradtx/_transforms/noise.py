"""Annealed Gaussian gradient noise, one random stream per path."""

from __future__ import annotations

import zlib
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np

from gradtx._core.lift import compute_dtype
from gradtx._core.module import field, hyperparam
from gradtx._core.per_array import PerArrayTransform
from gradtx._core.protocol import Params


def raw_key(value: Any, name: str) -> Any:
    """An int seed or a PRNG key (typed or raw) -> a raw uint32 key.

    An int seed gives its key's words as a tuple of NumPy uint32 scalars: leaves that JAX
    traces, and that Flax NNX, which holds the transformation as static structure, does not
    count as data. A key given as a JAX array stays one (it is data).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        with jax.ensure_compile_time_eval():  # concrete, also when built inside a trace
            words = np.asarray(jax.random.key_data(jax.random.key(value)))
        return tuple(np.uint32(w) for w in words)
    array = jnp.asarray(value) if not isinstance(value, jax.Array) else value
    if jnp.issubdtype(array.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(array)
    if array.dtype != jnp.uint32:
        raise TypeError(f"`{name}` must be an int seed or a PRNG key, got {value!r}")
    return array


def path_key(key: Any, path: str) -> Any:
    """The raw key a path's noise stream starts from: `fold_in(key, crc32(path))`."""
    return jax.random.fold_in(key, zlib.crc32(path.encode()))


class AddNoise(PerArrayTransform):
    """Add annealed Gaussian noise, one random stream per path (see `add_noise`)."""

    name: ClassVar[str] = "add_noise"
    unpackable: ClassVar[str] = "keeps one random stream per path"
    per_leaf_structure: ClassVar[bool] = True
    eta: Any = hyperparam()
    gamma: Any = hyperparam()
    seed: Any = field(default=0, converter=raw_key)

    def state_keys(self) -> tuple[str, ...]:
        """The path's step `count` and its PRNG key `rng_key`."""
        return ("count", "rng_key")

    def init_state(self, params: Params) -> dict:
        """Count 0 and the key `fold_in(seed, crc32(path))` for every path."""
        state = super().init_state(params)
        state["rng_key"] = {p: path_key(k, p) for p, k in state["rng_key"].items()}
        return state

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Count 0 and the seed's key (`init` then folds in the path)."""
        return {"count": jnp.zeros((), jnp.int32), "rng_key": jnp.asarray(self.seed, jnp.uint32)}

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`u = g + sqrt(eta / (t + 1)^gamma) * normal(key)`, with a fresh split of the key."""
        dtype = compute_dtype(g)
        count = slots["count"] + jnp.int32(1)
        key, sample = jax.random.split(slots["rng_key"])
        eta, gamma = self.eta.astype(dtype), self.gamma.astype(dtype)
        std = jnp.sqrt(eta / count.astype(dtype) ** gamma)
        u = g.astype(dtype) + std * jax.random.normal(sample, g.shape, dtype)
        return u.astype(g.dtype), {"count": count, "rng_key": key}


def add_noise(eta: float, gamma: float, seed: int | jax.Array = 0) -> AddNoise:
    r"""Add Gaussian noise whose variance decays with the step.

    Per path, at its $t$-th update ($t = 1, 2, \ldots$):

    $$u_t = g_t + \sqrt{\frac{\eta}{t^{\gamma}}}\ \xi_t,\qquad \xi_t \sim \mathcal N(0, I)$$

    Each path has its own random stream, so a path's noise does not depend on which other
    paths are present: its key starts as `jax.random.fold_in(seed_key, zlib.crc32(path))` and
    each update draws `jax.random.normal(sample, shape)` after
    `key, sample = jax.random.split(key)`. The same seed reproduces the same noise; successive
    steps draw different noise. The noise is drawn in at least float32.

    optax names this argument `key` (optax 0.2.8 still accepts `seed`); here `seed` takes either
    an int or a PRNG key (typed or raw).

    Args:
        eta: the initial variance $\eta$.
        gamma: the decay exponent $\gamma$ of the variance.
        seed: an int seed or a `jax.random` key.

    State:
        `count/<path>` (int32) and `rng_key/<path>` (the raw uint32 key of the path's
        stream). Packed params (`gradtx.pack`) are refused: they cannot hold a stream per path.

    Examples:
        >>> tx = gradtx.add_noise(0.01, 0.55, seed=0)
        >>> params = {"w": jnp.zeros(3)}
        >>> u1, _ = tx.update(params, tx.init(params))
        >>> u2, _ = tx.update(params, tx.init(params))
        >>> bool(jnp.all(u1["w"] == u2["w"]))
        True

    References:
        Neelakantan et al., "Adding Gradient Noise Improves Learning for Very Deep Networks",
        2015.
    """
    return AddNoise(eta, gamma, seed)
