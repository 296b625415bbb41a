"""Small transformations: averaging, centring, noise, normalising, NaN and sign guards."""

from __future__ import annotations

import zlib
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from gradtx._core.elementwise import ElementwiseTransform
from gradtx._core.lift import as_stored, compute_dtype, map_updates, zeros_for
from gradtx._core.module import as_float, field, hyperparam, static
from gradtx._paths.paths import flatten, is_unit
from gradtx._transforms.adam import _dtype_or_none
from gradtx._transforms.clipping import global_norm

__all__ = [
    "add_noise",
    "centralize",
    "ema",
    "keep_params_nonnegative",
    "normalize_by_update_norm",
    "scale_by_optimistic_gradient",
    "scale_gradient",
    "zero_nans",
]


# --- ema ----------------------------------------------------------------------------------------


class Ema(ElementwiseTransform):
    """An exponential moving average of the updates (see `ema`)."""

    name: ClassVar[str] = "ema"
    decay: Any = hyperparam()
    debias: bool = static(True)
    accumulator_dtype: Any = static(None, converter=_dtype_or_none)

    def state_keys(self) -> tuple[str, ...]:
        """The average `ema`, and the path's step `count` when debiasing."""
        return ("ema", "count") if self.debias else ("ema",)

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """A zero average in `accumulator_dtype` (default: the param's dtype) and count 0."""
        slots = {"ema": zeros_for(param, self.accumulator_dtype)}
        if self.debias:
            slots["count"] = jnp.zeros((), jnp.int32)
        return slots

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`e = decay * e + (1 - decay) * g`; the update is `e`, or `e / (1 - decay^t)`."""
        dtype = compute_dtype(g, slots["ema"])
        decay = self.decay.astype(dtype)
        new = as_stored(
            decay * slots["ema"].astype(dtype) + (1 - decay) * g.astype(dtype), slots["ema"]
        )
        if not self.debias:
            return new.astype(g.dtype), {"ema": new}
        count = slots["count"] + jnp.int32(1)
        u = new / (1 - decay ** count.astype(dtype))
        return u.astype(g.dtype), {"ema": new, "count": count}


def ema(decay: float, debias: bool = True, accumulator_dtype: Any = None) -> Ema:
    r"""An exponential moving average of the updates, optionally bias-corrected.

    Per path, with step $t$ counted per path:

    $$e_t = \delta\, e_{t-1} + (1-\delta)\, g_t,\qquad
      u_t = e_t \ \text{ or, with debias, }\ u_t = \frac{e_t}{1-\delta^t}$$

    Args:
        decay: the decay $\delta$ of the average.
        debias: divide by $1-\delta^t$, so early averages are not biased towards zero.
        accumulator_dtype: dtype of the average (default: the parameter's dtype).

    State:
        `ema/<path>` shaped like the parameter; `count/<path>` (int32) when `debias`.

    Examples:
        >>> tx = gradtx.ema(0.5)
        >>> state = tx.init({"w": jnp.zeros(2)})
        >>> u, state = tx.update({"w": jnp.ones(2)}, state)
        >>> u["w"], state["ema"]["w"]
        (Array([1., 1.], dtype=float32), Array([0.5, 0.5], dtype=float32))
    """
    return Ema(decay, debias, accumulator_dtype)


# --- centralize ---------------------------------------------------------------------------------


class Centralize(ElementwiseTransform):
    """Subtract the mean over all axes but the first (see `centralize`)."""

    name: ClassVar[str] = "centralize"
    per_leaf_structure: ClassVar[bool] = True

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`u = g - mean(g, axes 1..)` for arrays of rank 2 or more; else `u = g`."""
        if g.ndim < 2:
            return g, {}
        x = g.astype(compute_dtype(g))
        u = x - jnp.mean(x, axis=tuple(range(1, g.ndim)), keepdims=True)
        return u.astype(g.dtype), {}


def centralize() -> Centralize:
    r"""Gradient centralization: subtract from each array its mean over all axes but the first.

    For an array of rank $\ge 2$, $u_{i\ldots} = g_{i\ldots} - \operatorname{mean}_{\ldots}
    g_{i\ldots}$ (one mean per index of the first axis); vectors and scalars pass unchanged.
    The math needs the whole array, not one element at a time.

    Examples:
        >>> tx = gradtx.centralize()
        >>> g = {"w": jnp.array([[1.0, 3.0], [0.0, 4.0]]), "b": jnp.array([1.0, 3.0])}
        >>> u, _ = tx.update(g, tx.init(g))
        >>> u["w"], u["b"]
        (Array([[-1.,  1.], [-2.,  2.]], dtype=float32), Array([1., 3.], dtype=float32))

    References:
        Yong et al., "Gradient Centralization: A New Optimization Technique for Deep Neural
        Networks", 2020.
    """
    return Centralize()


# --- add_noise ----------------------------------------------------------------------------------


def _raw_key(value: Any, name: str) -> Any:
    """An int seed or a PRNG key (typed or raw) -> a raw uint32 key array."""
    if isinstance(value, int) and not isinstance(value, bool):
        return jax.random.key_data(jax.random.key(value))
    array = jnp.asarray(value) if not isinstance(value, jax.Array) else value
    if jnp.issubdtype(array.dtype, jax.dtypes.prng_key):
        return jax.random.key_data(array)
    if array.dtype != jnp.uint32:
        raise TypeError(f"`{name}` must be an int seed or a PRNG key, got {value!r}")
    return array


def reject_packed(params: Any, owner: str, why: str) -> None:
    """Raise a clear error for packed params (`gradtx.pack`), which `owner` cannot serve."""
    if any(is_unit(leaf) for leaf in flatten(params)[1]):
        raise TypeError(
            f"{owner} {why}, which packed params (gradtx.pack) cannot hold; apply it to the "
            "unpacked params."
        )


def path_key(key: Any, path: str) -> Any:
    """The raw key a path's noise stream starts from: `fold_in(key, crc32(path))`."""
    return jax.random.fold_in(key, zlib.crc32(path.encode()))


class AddNoise(ElementwiseTransform):
    """Add annealed Gaussian noise, one random stream per path (see `add_noise`)."""

    name: ClassVar[str] = "add_noise"
    per_leaf_structure: ClassVar[bool] = True
    eta: Any = hyperparam()
    gamma: Any = hyperparam()
    seed: Any = field(default=0, converter=_raw_key)

    def state_keys(self) -> tuple[str, ...]:
        """The path's step `count` and its PRNG key `rng_key`."""
        return ("count", "rng_key")

    def init(self, params: Any) -> dict:
        """Count 0 and the key `fold_in(seed, crc32(path))` for every path."""
        reject_packed(params, self.name, "keeps one random stream per path")
        state = super().init(params)
        state["rng_key"] = {p: path_key(k, p) for p, k in state["rng_key"].items()}
        return state

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Count 0 and the seed's key (`init` then folds in the path)."""
        return {"count": jnp.zeros((), jnp.int32), "rng_key": self.seed}

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


# --- normalize_by_update_norm -------------------------------------------------------------------


class NormalizeByUpdateNorm(ElementwiseTransform):
    """Divide all updates by their global norm (see `normalize_by_update_norm`)."""

    name: ClassVar[str] = "normalize_by_update_norm"
    scale_factor: Any = hyperparam(1.0)
    eps: Any = hyperparam(1e-6)

    def update(self, updates: Any, state: dict, params: Any = None, **extra: Any) -> tuple:
        """`u = scale_factor * g / (||g|| + eps)`, the norm over every present leaf."""
        self.check_state(state)
        factor = self.scale_factor / (global_norm(updates) + self.eps)

        def scaled(g: Any, _: Any) -> Any:
            return (g.astype(compute_dtype(g)) * factor).astype(g.dtype)

        return map_updates(scaled, updates, owner=self.name), state


def normalize_by_update_norm(scale_factor: float = 1.0, eps: float = 1e-6) -> NormalizeByUpdateNorm:
    r"""Scale the updates to a global norm of about `scale_factor`.

    $$u = \frac{s\, g}{\lVert g\rVert_2 + \epsilon}$$

    with the norm taken over every present leaf together.

    Args:
        scale_factor: the norm $s$ of the result.
        eps: added to the norm, so a zero gradient stays zero.

    Examples:
        >>> tx = gradtx.normalize_by_update_norm(eps=0.0)
        >>> tx.update({"w": jnp.array([3.0, 4.0])}, {})[0]["w"]
        Array([0.6, 0.8], dtype=float32)
    """
    return NormalizeByUpdateNorm(scale_factor, eps)


# --- zero_nans ----------------------------------------------------------------------------------


class ZeroNans(ElementwiseTransform):
    """Replace NaNs by zeros and record which paths had any (see `zero_nans`)."""

    name: ClassVar[str] = "zero_nans"
    per_leaf_structure: ClassVar[bool] = True

    def state_keys(self) -> tuple[str, ...]:
        """`found_nan`: whether the path's last update held a NaN."""
        return ("found_nan",)

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """`found_nan = False`."""
        return {"found_nan": jnp.zeros((), jnp.bool_)}

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`u = where(isnan(g), 0, g)`; `found_nan = any(isnan(g))`."""
        nan = jnp.isnan(g)
        return jnp.where(nan, jnp.zeros_like(g), g), {"found_nan": jnp.any(nan)}


def zero_nans() -> ZeroNans:
    r"""Replace NaN elements of the updates by zero: $u = g$ where $g$ is a number, else $0$.

    Infinities are kept. The state records, per path, whether the last update of that path
    held a NaN, so it can be logged; a path without an update keeps its flag.

    State:
        `found_nan/<path>`, a bool scalar.

    Examples:
        >>> tx = gradtx.zero_nans()
        >>> g = {"w": jnp.array([1.0, jnp.nan])}
        >>> u, state = tx.update(g, tx.init(g))
        >>> u["w"], state["found_nan"]["w"]
        (Array([1., 0.], dtype=float32), Array(True, dtype=bool))
    """
    return ZeroNans()


# --- keep_params_nonnegative --------------------------------------------------------------------


class KeepParamsNonnegative(ElementwiseTransform):
    """Stop updates at zero so parameters stay non-negative (see `keep_params_nonnegative`)."""

    name: ClassVar[str] = "keep_params_nonnegative"
    needs_params: ClassVar[bool] = True

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """`u = -param` where `param + g < 0`, else `u = g`."""
        dtype = compute_dtype(g, param)
        x, p = g.astype(dtype), param.astype(dtype)
        return jnp.where(p + x < 0, -p, x).astype(g.dtype), {}


def keep_params_nonnegative() -> KeepParamsNonnegative:
    r"""Change the updates so that the parameters stay $\ge 0$ after they are applied.

    $u = -\theta$ where $\theta + g < 0$, else $u = g$: an element that would cross zero lands
    on zero. Put it last in a chain, after the learning rate. A parameter that is already
    negative is moved to zero.

    Examples:
        >>> tx = gradtx.keep_params_nonnegative()
        >>> params = {"w": jnp.array([1.0, 0.5])}
        >>> tx.update({"w": jnp.array([-0.5, -2.0])}, {}, params)[0]["w"]
        Array([-0.5, -0.5], dtype=float32)
    """
    return KeepParamsNonnegative()


# --- scale_by_optimistic_gradient ---------------------------------------------------------------


class ScaleByOptimisticGradient(ElementwiseTransform):
    """`u = (alpha + beta) g - beta g_prev` (see `scale_by_optimistic_gradient`)."""

    name: ClassVar[str] = "scale_by_optimistic_gradient"
    alpha: Any = hyperparam(1.0)
    beta: Any = hyperparam(1.0)

    def state_keys(self) -> tuple[str, ...]:
        """The last gradient `previous_gradient` and the path's step `count`."""
        return ("previous_gradient", "count")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """A zero previous gradient (the param's dtype) and count 0."""
        return {"previous_gradient": zeros_for(param), "count": jnp.zeros((), jnp.int32)}

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """The optimistic combination; at a path's first step `g_prev = g`."""
        dtype = compute_dtype(g, slots["previous_gradient"])
        grad = g.astype(dtype)
        prev = jnp.where(slots["count"] == 0, grad, slots["previous_gradient"].astype(dtype))
        alpha, beta = self.alpha.astype(dtype), self.beta.astype(dtype)
        u = (alpha + beta) * grad - beta * prev
        return u.astype(g.dtype), {"previous_gradient": grad, "count": slots["count"] + 1}


def scale_by_optimistic_gradient(
    alpha: float = 1.0, beta: float = 1.0
) -> ScaleByOptimisticGradient:
    r"""The optimistic gradient: extrapolate from the previous gradient.

    $$u_t = (\alpha + \beta)\, g_t - \beta\, g_{t-1}$$

    with $g_0 = g_1$ at a path's first step (so $u_1 = \alpha g_1$). With a learning rate this
    is optimistic gradient descent, used for min-max problems.

    Args:
        alpha: the weight of the current gradient.
        beta: the weight of the gradient's change.

    State:
        `previous_gradient/<path>` shaped like the parameter; `count/<path>` (int32).

    Examples:
        >>> tx = gradtx.scale_by_optimistic_gradient()
        >>> state = tx.init({"w": jnp.zeros(1)})
        >>> u, state = tx.update({"w": jnp.array([1.0])}, state)
        >>> u, state = tx.update({"w": jnp.array([3.0])}, state)
        >>> u["w"]
        Array([5.], dtype=float32)

    References:
        Mokhtari et al., "A Unified Analysis of Extra-gradient and Optimistic Gradient Methods
        for Saddle Point Problems: Proximal Point Approach", 2019.
    """
    return ScaleByOptimisticGradient(alpha, beta)


# --- scale_gradient -----------------------------------------------------------------------------


@jax.custom_vjp
def _scale_in_backward(x: Any, factor: Any) -> Any:
    return x


def _forward(x: Any, factor: Any) -> tuple[Any, Any]:
    return x, factor


def _backward(factor: Any, cotangent: Any) -> tuple[Any, Any]:
    scaled = cotangent.astype(compute_dtype(cotangent)) * factor
    return scaled.astype(cotangent.dtype), jnp.zeros_like(factor)


_scale_in_backward.defvjp(_forward, _backward)


def scale_gradient(inputs: Any, scale: float | jax.Array) -> Any:
    r"""Return `inputs` unchanged, but scale the gradient that flows back through them.

    The forward value is exactly `inputs`; in the backward pass the cotangent of every
    floating-point leaf is multiplied by `scale`: $\partial L/\partial x \to s\,\partial
    L/\partial x$. `scale=0` acts like `jax.lax.stop_gradient`. This is a function applied
    inside the model or loss, not a transformation.

    Args:
        inputs: an array or a pytree of arrays.
        scale: the factor (a number or a float32 scalar array; no gradient flows into it).

    Examples:
        >>> f = lambda x: jnp.sum(gradtx.scale_gradient(x, 0.5) ** 2)
        >>> jax.grad(f)(jnp.array([1.0, 2.0]))
        Array([1., 2.], dtype=float32)
    """
    factor = as_float(scale, "scale")

    def leaf(x: Any) -> Any:
        if x is None or not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
            return x
        return _scale_in_backward(x, factor)

    return jax.tree.map(leaf, inputs)
