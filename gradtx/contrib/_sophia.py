"""Sophia: momentum divided by a clipped, periodically estimated diagonal Hessian."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gradtx._core.lift import (
    as_stored,
    check_state_keys,
    compute_dtype,
    dtype_or_none,
    init_slots,
    update_slots,
    zeros_for,
)
from gradtx._core.module import (
    as_int,
    decay_rate,
    field,
    hyperparam,
    non_negative,
    positive,
    static,
)
from gradtx._core.protocol import Params, Transformation, Updates
from gradtx._core.widening import shaped_like
from gradtx._layouts.complex import from_real, is_complex, real_dtype, to_real
from gradtx._layouts.packed import reject_packed
from gradtx._optax.wrapped import as_transformation
from gradtx._optimizers.descent import descent
from gradtx._paths.paths import flatten
from gradtx._paths.subset import present_paths
from gradtx._transforms.adam import moving_average
from gradtx._transforms.noise import path_key, raw_key
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx._transforms.weight_decay import add_decayed_weights
from gradtx.contrib._reductions import needs_params_error

_OBJ_FN = (
    "needs the objective: call `tx.update(grads, state, params, obj_fn=obj_fn)` with "
    "`obj_fn(params) -> loss`, a scalar function of the params alone (for a loss of the "
    "params and a batch: `obj_fn = lambda p: loss_fn(p, batch)`)."
)


def _seed(value: Any, name: str) -> Any:
    return raw_key(0 if value is None else value, name)


class HutchinsonEstimatorDiagHessian(Transformation):
    """Hutchinson's estimate of the Hessian's diagonal (see `hutchinson_estimator_diag_hessian`)."""

    name: ClassVar[str] = "hutchinson_estimator_diag_hessian"
    random_seed: Any = field(default=0, converter=_seed)

    def state_keys(self) -> tuple[str, ...]:
        """Each path's PRNG key `key`."""
        return ("key",)

    def init_state(self, params: Params) -> dict:
        """The key `fold_in(random_seed, crc32(path))` for every path."""
        reject_packed(params, self.name, "keeps one random stream per path")
        seed = jnp.asarray(self.random_seed, jnp.uint32)
        keys = init_slots(params, lambda p: {"key": seed}, ("key",))["key"]
        return {"key": {p: path_key(k, p) for p, k in keys.items()}}

    def step(
        self, updates: Updates, state: dict, params: Params = None, obj_fn: Any = None, **extra: Any
    ) -> tuple:
        """The estimate `(H r) * r` at the paths present in `updates` (`None` elsewhere)."""
        check_state_keys(self.name, state, self.state_keys())
        if params is None:
            raise needs_params_error(self.name)
        if obj_fn is None:
            raise ValueError(f"{self.name} {_OBJ_FN}")
        u_paths, u_leaves, u_def = flatten(updates)
        present = {p for p, g in zip(u_paths, u_leaves) if g is not None}
        p_paths, p_leaves, p_def = flatten(params)
        keys, signs, tangent = dict(state["key"]), {}, []
        for path, x in zip(p_paths, p_leaves):
            if x is None:
                tangent.append(None)
                continue
            if path not in present:  # no gradient: no direction along it, its key stays
                tangent.append(jnp.zeros(jnp.shape(x), x.dtype))
                continue
            if path not in keys:
                raise KeyError(
                    f"{self.name}: the state has no key for path {path!r}; the params changed "
                    "since init (call `gradtx.reconcile(tx, state, params)`)."
                )
            keys[path], sample = jax.random.split(keys[path])
            # A complex leaf gets a sign for each part (its real view): the tangent re + i im.
            shape = (2, *jnp.shape(x)) if is_complex(x) else jnp.shape(x)
            signs[path] = jax.random.rademacher(sample, shape, jnp.float32).astype(
                real_dtype(x.dtype)
            )
            tangent.append(from_real(signs[path], x.dtype) if is_complex(x) else signs[path])
        hvp = jax.jvp(jax.grad(obj_fn), (params,), (p_def.unflatten(tangent),))[1]
        h_paths, h_leaves, _ = flatten(hvp)
        by_path = dict(zip(h_paths, h_leaves))
        missing = sorted(present - set(signs))
        if missing:
            raise KeyError(
                f"{self.name}: the gradients have entries at {missing[:3]} but the params have "
                "no parameter there."
            )
        out = [None if p not in present else _times_signs(by_path[p], signs[p]) for p in u_paths]
        return u_def.unflatten(out), {"key": keys}


def _times_signs(hvp: Any, signs: Any) -> Any:
    """`(H r) * r`; for a complex leaf, each part's estimate as one complex number.

    `jax.grad` of a real function gives `df/dre - i df/dim` at a complex leaf, so the product
    with the tangent `r_re + i r_im` is `(H r)_re - i (H r)_im`.
    """
    if not is_complex(hvp):
        return hvp * signs
    return lax.complex(jnp.real(hvp) * signs[0], -jnp.imag(hvp) * signs[1])


def hutchinson_estimator_diag_hessian(
    random_seed: int | jax.Array | None = None,
) -> HutchinsonEstimatorDiagHessian:
    r"""Estimate the diagonal of the Hessian with Hutchinson's method.

    With $r$ a vector of independent random signs ($\pm 1$, Rademacher) and $f$ the
    objective,

    $$\hat h = (\nabla^2 f(\theta)\, r) \odot r,\qquad \mathbb E[\hat h] = \operatorname{diag}
      \nabla^2 f(\theta)$$

    one Hessian-vector product (`jax.jvp` of `jax.grad(obj_fn)`, about the cost of two
    gradients) per estimate: unbiased, but of high variance. The update *returns the
    estimate* (shaped like the params; the gradients only say which paths are present) and
    needs the objective as `obj_fn`, a scalar function of the params alone:
    `tx.update(grads, state, params, obj_fn=lambda p: loss_fn(p, batch))`. It is Sophia's
    default `hessian_diagonal_fn`.

    Each path has its own random stream: its key starts as
    `jax.random.fold_in(key, zlib.crc32(path))` and each estimate draws
    `jax.random.rademacher(sample, shape)` after `key, sample = jax.random.split(key)`. A path
    without a gradient (`None`) gets no direction (its entry of $r$ is 0, its key stays), so
    the estimate of the other paths stays unbiased. optax splits one key over the whole tree:
    the two draw different (equally distributed) signs. On a function whose Hessian is
    diagonal the estimate is exact whatever the signs. A complex leaf is a pair of reals, as
    everywhere in gradtx: each part gets its own signs, and the estimates of the two parts
    come back as the real and imaginary parts of one complex number. Packed params are
    refused.
    With data parallelism, average the estimates across devices as you average gradients.

    Args:
        random_seed: an int seed or a `jax.random` key (default: 0).

    State:
        `key/<path>`: the raw uint32 key of each path's stream.

    Examples:
        >>> tx = gradtx.contrib.hutchinson_estimator_diag_hessian(random_seed=0)
        >>> params = {"w": jnp.array([1.0, 2.0])}
        >>> obj_fn = lambda p: jnp.sum(jnp.array([3.0, 5.0]) * p["w"] ** 2)  # diagonal Hessian
        >>> h, _ = tx.update(params, tx.init(params), params, obj_fn=obj_fn)
        >>> h["w"]  # exact here: the Hessian is diag(6, 10)
        Array([ 6., 10.], dtype=float32)

    References:
        Hutchinson, "A stochastic estimator of the trace of the influence matrix for
        Laplacian smoothing splines", 1989; Yao et al., "ADAHESSIAN: An Adaptive Second
        Order Optimizer for Machine Learning", AAAI 2021.
    """
    return HutchinsonEstimatorDiagHessian(random_seed)


class ScaleBySophia(Transformation):
    """Sophia's clipped preconditioned momentum (see `scale_by_sophia`)."""

    name: ClassVar[str] = "scale_by_sophia"
    b1: Any = hyperparam(0.965, check=decay_rate)
    b2: Any = hyperparam(0.99, check=decay_rate)
    eps: Any = hyperparam(1e-8, check=non_negative)
    gamma: Any = hyperparam(0.01, check=non_negative)
    clip_threshold: Any = hyperparam(1.0, check=positive)
    update_interval: Any = field(default=10, converter=as_int)
    hessian_diagonal_fn: Any = field(
        default_factory=HutchinsonEstimatorDiagHessian, converter=as_transformation
    )
    mu_dtype: Any = static(None, converter=dtype_or_none)
    verbose: bool = static(False)
    print_win_rate_every_n_steps: Any = field(default=0, converter=as_int)

    def __check__(self) -> None:
        k = self.update_interval
        if isinstance(k, (np.generic, np.ndarray)) and int(k) < 1:
            raise ValueError(f"{self.name}: `update_interval` must be at least 1, got {int(k)}.")
        n = self.print_win_rate_every_n_steps
        if self.verbose and isinstance(n, (np.generic, np.ndarray)) and int(n) < 1:
            raise ValueError(
                f"{self.name}: with `verbose=True`, `print_win_rate_every_n_steps` must be at "
                f"least 1, got {int(n)}."
            )

    def state_keys(self) -> tuple[str, ...]:
        """The momentum `mu`, the Hessian estimate `nu`, the step `count`, the estimator's state."""
        return ("mu", "nu", "count", "hessian_fn")

    def init_state(self, params: Params) -> dict:
        """Zero `mu` (in `mu_dtype`) and `nu`, count 0, and the estimator's state."""
        reject_packed(params, self.name, "estimates each path's Hessian on its own schedule")

        def leaf_init(param: Any) -> dict[str, Any]:
            return {
                "mu": zeros_for(param, self.mu_dtype),
                "nu": zeros_for(param),
                "count": jnp.zeros((), jnp.int32),
            }

        slots = init_slots(params, leaf_init, ("mu", "nu", "count"), step_counts=("count",))
        return {**slots, "hessian_fn": self.hessian_diagonal_fn.init_state(params)}

    def _estimate(
        self, updates: Updates, state: dict, params: Params, extra: dict
    ) -> tuple[dict, Any]:
        """The estimator's output by path, run only when a present path is due for one."""
        present = present_paths(updates)
        k = jnp.asarray(self.update_interval, jnp.int32)
        counts = state["count"]
        due = [counts[p] % k == 0 for p in present if p in counts]
        if not due:
            return {}, state["hessian_fn"]

        def estimate(inner: Any) -> tuple[Any, Any]:
            return self.hessian_diagonal_fn.step(updates, inner, params, **extra)

        shapes = jax.eval_shape(estimate, state["hessian_fn"])

        def skip(inner: Any) -> tuple[Any, Any]:
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes[0])
            return shaped_like(zeros, shapes[0]), inner  # explicit axes: the same layout too

        hess, inner = lax.cond(jnp.any(jnp.stack(due)), estimate, skip, state["hessian_fn"])
        h_paths, h_leaves, _ = flatten(hess)
        by_path = {p: h for p, h in zip(h_paths, h_leaves) if h is not None}
        lacking = [p for p in present if p not in by_path]
        if lacking:
            raise ValueError(
                f"{self.name}: `hessian_diagonal_fn` gave no estimate for the present paths "
                f"{lacking[:3]}; it must return a tree shaped like the gradients."
            )
        # A complex leaf's estimate in the real layout of its state (pairs of reals).
        return {
            p: to_real(by_path[p]) if is_complex(by_path[p]) else by_path[p] for p in present
        }, inner

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """The clipped step from the previous estimate; then, when due, a new estimate."""
        check_state_keys(self.name, state, self.state_keys())
        if params is None:
            raise ValueError(
                f"{self.name} needs the params: call `tx.update(grads, state, params, "
                "obj_fn=obj_fn)`."
            )
        hess, inner = self._estimate(updates, state, params, extra)
        k = self.update_interval
        clipped = self.clip_threshold
        win: list = []

        def leaf(g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
            dtype = compute_dtype(g, slots["mu"], slots["nu"])
            count = slots["count"]
            b1, b2 = self.b1.astype(dtype), self.b2.astype(dtype)
            mu = moving_average(b1, slots["mu"], g.astype(dtype), dtype)
            t = (count + 1).astype(dtype)
            nu = slots["nu"].astype(dtype)
            scale = jnp.maximum(self.gamma.astype(dtype) * nu, self.eps.astype(dtype))
            u = mu / (1 - b1**t) / scale
            if clipped is not None:
                c = clipped.astype(dtype)
                if self.verbose:
                    win.append((jnp.sum(jnp.abs(u) < c), u.size, count + 1))
                u = jnp.clip(u, -c, c)
            due = count % jnp.asarray(k, jnp.int32) == 0
            fresh = b2 * nu + (1 - b2) * slots["hess"].astype(dtype)
            new_nu = as_stored(jnp.where(due, fresh, nu), slots["nu"])
            return u, {"mu": mu, "nu": new_nu}

        slots = {"mu": state["mu"], "nu": state["nu"], "count": state["count"], "hess": hess}
        new_updates, slots = update_slots(
            leaf, updates, slots, params, owner=self.name, element_slots=("mu", "nu")
        )
        if win:
            self._print_win_rate(win)
        del slots["hess"]
        return new_updates, {**slots, "hessian_fn": inner}

    def _print_win_rate(self, win: list) -> None:
        """Print the share of elements the clipping left alone (at the last path's step)."""
        kept = sum(n.astype(jnp.float32) for n, _, _ in win)
        rate = kept / float(sum(size for _, size, _ in win) or 1)
        step = win[-1][2]
        every = jnp.asarray(self.print_win_rate_every_n_steps, jnp.int32)
        lax.cond(
            step % every == 0,
            lambda: jax.debug.print("Sophia optimizer win rate: {}", rate),
            lambda: None,
        )


def scale_by_sophia(
    b1: float = 0.965,
    b2: float = 0.99,
    eps: float = 1e-8,
    gamma: float = 0.01,
    clip_threshold: float | None = 1.0,
    update_interval: int = 10,
    hessian_diagonal_fn: Any = None,
    mu_dtype: Any = None,
    verbose: bool = False,
    print_win_rate_every_n_steps: int = 0,
) -> ScaleBySophia:
    r"""Rescale updates by Sophia: momentum over a clipped diagonal-Hessian estimate.

    Per path, with step $t$ counted per path, $\hat h$ the estimate of the Hessian's
    diagonal (`hessian_diagonal_fn`, Hutchinson's by default) and $k$ = `update_interval`:

    $$m_t = \beta_1 m_{t-1} + (1-\beta_1) g_t,\qquad
      u_t = \operatorname{clip}\left(\frac{m_t / (1-\beta_1^t)}{\max(\gamma\, h_{t-1},\
      \epsilon)},\ \pm\rho\right)$$

    $$h_t = \beta_2 h_{t-1} + (1-\beta_2)\, \hat h_t\ \text{ if } (t-1) \bmod k = 0,
      \text{ else } h_{t-1}$$

    so the step uses the estimate made at an earlier step, and a new estimate is made at
    steps $1, k+1, 2k+1, \ldots$ of each path (the estimator runs once, under `lax.cond`,
    when any present path is due). The clipping at $\rho$ = `clip_threshold` bounds the
    step where the curvature is small or negative; `None` turns it off. Before the first
    estimate $h = 0$, so the first step is $\pm\rho$ times the sign of the momentum. The
    effective decay of $h$ is about $1 - (1-\beta_2)/k$ per step.

    `update` needs the params and whatever the estimator needs, passed on as keyword
    arguments: Hutchinson's estimator takes `obj_fn`, a scalar function of the params alone
    (`tx.update(grads, state, params, obj_fn=lambda p: loss_fn(p, batch))`). optax 0.2.8
    defines `scale_by_sophia` in `optax.contrib._sophia` without exporting it.

    Args:
        b1: decay of the momentum.
        b2: decay of the Hessian estimate's moving average.
        eps: the floor of the denominator.
        gamma: the scale $\gamma$ of the Hessian estimate.
        clip_threshold: the bound $\rho$ on each element of the update, or `None`.
        update_interval: the number of steps $k$ between two estimates (an int32 leaf).
        hessian_diagonal_fn: a transformation whose update returns the estimate of the
            Hessian's diagonal, shaped like the gradients (default:
            `hutchinson_estimator_diag_hessian()`).
        mu_dtype: dtype of the momentum (default: the parameter's dtype).
        verbose: print the *win rate*, the share of elements the clipping left alone (the
            paper suggests keeping it between 0.1 and 0.5; if it is lower, raise `gamma`).
        print_win_rate_every_n_steps: print it every this many steps (with `verbose`).

    State:
        `mu/<path>` (in `mu_dtype`) and `nu/<path>` (the Hessian estimate $h$) shaped like
        the parameter, `count/<path>` (int32), and `hessian_fn`, the estimator's state
        (`hessian_fn/key/<path>` for Hutchinson's). Packed params are refused; a complex
        leaf is a pair of reals (its state in the real layout).

    Examples:
        >>> tx = gradtx.contrib.scale_by_sophia()
        >>> params = {"w": jnp.array([1.0, -2.0])}
        >>> obj_fn = lambda p: jnp.sum(p["w"] ** 2)
        >>> state = tx.init(params)
        >>> u, state = tx.update(jax.grad(obj_fn)(params), state, params, obj_fn=obj_fn)
        >>> u["w"]  # no estimate yet: the step is clipped to +-1
        Array([ 1., -1.], dtype=float32)
        >>> jnp.round(state["nu"]["w"], 4)  # the first estimate of the diagonal (2), averaged in
        Array([0.02, 0.02], dtype=float32)

    References:
        Liu et al., "Sophia: A Scalable Stochastic Second-order Optimizer for Language Model
        Pre-training", ICLR 2024.
    """
    if hessian_diagonal_fn is None:
        hessian_diagonal_fn = hutchinson_estimator_diag_hessian()
    return ScaleBySophia(
        b1,
        b2,
        eps,
        gamma,
        clip_threshold,
        update_interval,
        hessian_diagonal_fn,
        mu_dtype,
        verbose,
        print_win_rate_every_n_steps,
    )


def sophia(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.965,
    b2: float = 0.99,
    eps: float = 1e-8,
    weight_decay: float = 1e-4,
    weight_decay_mask: Any = None,
    gamma: float = 0.01,
    clip_threshold: float | None = 1.0,
    update_interval: int = 10,
    hessian_diagonal_fn: Any = None,
    mu_dtype: Any = None,
    verbose: bool = False,
    print_win_rate_every_n_steps: int = 0,
) -> Any:
    r"""Sophia with decoupled weight decay.

    `chain(scale_by_sophia(...), add_decayed_weights(weight_decay, weight_decay_mask),
    scale_by_learning_rate(learning_rate))`:

    $$\theta_t = \theta_{t-1} - \eta \left(\operatorname{clip}\left(\frac{\hat m_t}
      {\max(\gamma\, h_{t-1}, \epsilon)}, \pm\rho\right) + \lambda\, \theta_{t-1}\right)$$

    with $h$ a moving average of estimates of the Hessian's diagonal, refreshed every
    `update_interval` steps (see `scale_by_sophia`). With the default Hutchinson estimator
    (Sophia-H) `update` needs the objective:
    `tx.update(grads, state, params, obj_fn=lambda p: loss_fn(p, batch))`, one extra
    Hessian-vector product every `update_interval` steps. The paper pairs it with a small
    learning rate: the clipping makes $\eta$ the largest step per element.

    Args:
        learning_rate: a number or a schedule.
        b1: decay of the momentum.
        b2: decay of the Hessian estimate's moving average.
        eps: the floor of the denominator.
        weight_decay: the decoupled decay rate $\lambda$ (multiplied by the learning rate).
        weight_decay_mask: selector of the paths to decay; default: all.
        gamma: the scale $\gamma$ of the Hessian estimate.
        clip_threshold: the bound $\rho$ on each element of the preconditioned step, or `None`.
        update_interval: the number of steps between two estimates.
        hessian_diagonal_fn: the estimator (default: `hutchinson_estimator_diag_hessian()`).
        mu_dtype: dtype of the momentum (default: the parameter's dtype).
        verbose: print the share of elements the clipping left alone.
        print_win_rate_every_n_steps: print it every this many steps (with `verbose`).

    State:
        `mu/<path>`, `nu/<path>`, `count/<path>`, `hessian_fn/key/<path>`;
        `schedule_count/<path>` with a learning-rate schedule.

    Examples:
        >>> tx = gradtx.contrib.sophia(1e-3)
        >>> params = {"w": jnp.ones(2)}
        >>> sorted(gradtx.state_dict(tx.init(params)))
        ['count/w', 'hessian_fn/key/w', 'mu/w', 'nu/w']
        >>> obj_fn = lambda p: jnp.sum(p["w"] ** 2)
        >>> u, _ = tx.update(jax.grad(obj_fn)(params), tx.init(params), params, obj_fn=obj_fn)

    References:
        Liu et al., "Sophia: A Scalable Stochastic Second-order Optimizer for Language Model
        Pre-training", ICLR 2024.
    """
    clipped = scale_by_sophia(
        b1,
        b2,
        eps,
        gamma,
        clip_threshold,
        update_interval,
        hessian_diagonal_fn,
        mu_dtype,
        verbose,
        print_win_rate_every_n_steps,
    )
    decay = add_decayed_weights(weight_decay, weight_decay_mask)
    return descent("sophia", learning_rate, clipped, decay)
