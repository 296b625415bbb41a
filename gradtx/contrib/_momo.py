"""MoMo: momentum with a Polyak-type step size from a model of the loss (Schaipp et al.)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import as_stored, compute_dtype, update_slots, zeros_for
from gradtx._core.module import decay_rate, hyperparam, non_negative, static
from gradtx._core.per_array import PerArrayTransform, hyperparam_at
from gradtx._core.protocol import Params, Updates
from gradtx._layouts.step_counts import next_count
from gradtx._transforms.scale import ScalarOrSchedule
from gradtx.contrib._reduce_on_plateau import missing_value_error
from gradtx.contrib._reductions import bias_correction, flat_dot, needs_params_error, scalar_copy

_GLOBAL = ("barf", "gamma", "lb", "count")
# Below this squared norm of the momentum the step is zero: float64's machine epsilon.
_TINY = float(jnp.finfo(jnp.float64).eps)


def _step_size(
    tx: Any, alpha: Any, rho: Any, barf: Any, gamma: Any, dx: Any, norm: Any, lb: Any, bc1: Any
) -> tuple[Any, Any]:
    """The step size and the next lower bound (the same one unless `adapt_lower_bound`).

    `tau = min(alpha / bc1, (rho (barf - bc1 lb - gamma) + <d, x>)_+ / norm)`.
    """
    if tx.adapt_lower_bound:
        cap = rho * (barf - gamma) + dx
        lb = jnp.where(cap < rho * bc1 * lb, jnp.maximum(cap / (2 * bc1 * rho), tx.lower_bound), lb)
    t1 = jnp.maximum(rho * (barf - bc1 * lb - gamma) + dx, 0.0) / norm
    t1 = jnp.where(norm <= _TINY, jnp.float32(0), t1)
    tau = jnp.minimum(alpha / bc1, t1)
    new_lb = lb
    if tx.adapt_lower_bound:
        new_lb = jnp.maximum((barf + dx - gamma - 0.5 * tau * norm) / bc1, tx.lower_bound)
    return tau, new_lb


class MomoStep(PerArrayTransform):
    """The step `momo` and `momo_adam` share: averages, then the capped model step.

    Over all present paths it averages the loss, `<g, x>` and the moments, and moves each
    path along its direction by the step size of the model of the loss. Subclasses define
    `slot_keys()` (the per-path moments, `exp_avg` first) and:

        decays(count) -> (beta, bc1, bc2): the decay of the averages and the bias
            corrections of the first and second moments (`bc2` unused by `momo`)
        moments(grad, slots, beta, dtype) -> the new moments of one array, as stored
        direction(moments, dtype, bc2) -> the direction `d` of one array
    """

    needs_params: ClassVar[bool] = True

    if TYPE_CHECKING:  # each subclass's own fields (here they would come first) and math
        learning_rate: ClassVar[Any]
        lower_bound: ClassVar[Any]
        weight_decay: ClassVar[Any]

        def decays(self, count: Any) -> tuple[Any, Any, Any]: ...
        def direction(self, moments: dict, dtype: Any, bc2: Any) -> Any: ...

    def state_keys(self) -> tuple[str, ...]:
        """The moments per path; the loss average, `gamma`, the lower bound and the step."""
        return (*self.slot_keys(), *_GLOBAL)

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Zero moments."""
        return {name: zeros_for(param) for name in self.slot_keys()}

    def init_state(self, params: Params) -> dict:
        """Zero moments per path, and the global scalars."""
        state = super().init_state(params)
        state["barf"] = jnp.zeros((), jnp.float32)
        state["gamma"] = jnp.zeros((), jnp.float32)
        state["lb"] = scalar_copy(self.lower_bound)
        state["count"] = jnp.zeros((), jnp.int32)
        return state

    def moments(self, grad: Any, slots: dict, beta: Any, dtype: Any) -> dict:
        """The momentum `exp_avg` of one array, as stored."""
        b, m = beta.astype(dtype), slots["exp_avg"]
        return {"exp_avg": as_stored(b * m.astype(dtype) + (1 - b) * grad, m)}

    def step(self, updates: Updates, state: dict, params: Params = None, **extra: Any) -> tuple:
        """Average the loss, the moments and `<g, x>`; take the capped model step."""
        self.check_state(state)
        if params is None:
            raise needs_params_error(self.name)
        value = extra.get("value")
        if value is None:
            raise missing_value_error(self.name)
        count = state["count"]
        beta, bc1, bc2 = self.decays(count)
        grads_x, moments_x, norms = [], [], []

        def average(g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
            dtype = compute_dtype(g, param, *slots.values())
            grad, x = g.astype(dtype), param.astype(dtype)
            new = self.moments(grad, slots, beta, dtype)
            d = new["exp_avg"]
            grads_x.append((grad, x))
            moments_x.append((d, x))
            norms.append((d, self.direction(new, dtype, bc2)))
            return g, new

        slots = {k: state[k] for k in self.slot_keys()}
        _, slots = update_slots(average, updates, slots, params, owner=self.name, needs_params=True)
        barf = beta * state["barf"] + (1 - beta) * jnp.asarray(value, jnp.float32)
        gamma = beta * state["gamma"] + (1 - beta) * flat_dot(grads_x)
        alpha = hyperparam_at(self.learning_rate, count)
        rho = 1 + alpha * self.weight_decay
        tau, lb = _step_size(
            self, alpha, rho, barf, gamma, flat_dot(moments_x), flat_dot(norms), state["lb"], bc1
        )
        shrink = alpha * self.weight_decay

        def move(g: Any, leaf: dict, param: Any) -> tuple[Any, dict]:
            dtype = compute_dtype(g, param, *leaf.values())
            d = self.direction({k: v.astype(dtype) for k, v in leaf.items()}, dtype, bc2)
            # x_new = (x - tau d) / rho
            u = -(shrink.astype(dtype) * param.astype(dtype) + tau.astype(dtype) * d)
            return u / rho.astype(dtype), {}

        new_updates, _ = update_slots(
            move, updates, slots, params, owner=self.name, needs_params=True
        )
        return new_updates, {
            **slots,
            "barf": barf,
            "gamma": gamma,
            "lb": lb,
            "count": next_count(count),
        }


class Momo(MomoStep):
    """MoMo: SGD with momentum and an adaptive step size (see `momo`)."""

    name: ClassVar[str] = "momo"
    learning_rate: Any = hyperparam(1.0, required=True)
    beta: Any = hyperparam(0.9, check=decay_rate)
    lower_bound: Any = hyperparam(0.0)
    weight_decay: Any = hyperparam(0.0, check=non_negative)
    adapt_lower_bound: bool = static(False)

    def slot_keys(self) -> tuple[str, ...]:
        """The momentum `exp_avg` of each path."""
        return ("exp_avg",)

    def decays(self, count: Any) -> tuple[Any, Any, Any]:
        """`beta`, 0 at the first step (which starts the averages); no bias corrections."""
        return jnp.where(count == 0, jnp.float32(0), self.beta), jnp.ones((), jnp.float32), None

    def direction(self, moments: dict, dtype: Any, bc2: Any) -> Any:
        """The momentum itself."""
        return moments["exp_avg"]


def momo(
    learning_rate: ScalarOrSchedule = 1.0,
    beta: float = 0.9,
    lower_bound: float = 0.0,
    weight_decay: float = 0.0,
    adapt_lower_bound: bool = False,
) -> Momo:
    r"""MoMo: SGD with momentum and a Polyak-type step size from a model of the loss.

    Call `update` with the loss as `value`. Over all present paths together, with $k$ the
    global step, $\alpha_k$ the learning rate, $\lambda$ the weight decay, $f_\star$ the
    lower bound and the averages started at their first values ($\beta$ is 0 at $k = 0$):

    $$\bar f_k = \beta \bar f_{k-1} + (1-\beta) f(x_k),\quad
      d_k = \beta d_{k-1} + (1-\beta) g_k,\quad
      \gamma_k = \beta\gamma_{k-1} + (1-\beta)\langle g_k, x_k\rangle$$

    $$\tau_k = \min\Big(\alpha_k,\ \frac{\big(\rho_k(\bar f_k - f_\star - \gamma_k)
      + \langle d_k, x_k\rangle\big)_+}{\lVert d_k\rVert^2}\Big),\qquad
      x_{k+1} = \frac{x_k - \tau_k d_k}{\rho_k},\quad \rho_k = 1 + \alpha_k\lambda$$

    so the step is the smaller of the learning rate and the step to where the model of the
    loss (the averaged linearisations, truncated at $f_\star$) reaches its bound; $\tau_k =
    0$ where $\lVert d_k\rVert^2$ is below float64's machine epsilon. The weight decay is
    the proximal step of $\frac{\lambda}{2}\lVert x\rVert^2$, as in the paper (optax 0.2.8
    divides only $x_k$ by $\rho_k$, not the step). The update $x_{k+1} - x_k$ is already a
    descent step.

    With `adapt_lower_bound`, $f_\star$ is estimated on the fly (the paper's MoMo$^*$): with
    $h_k = \bar f_k + \langle d_k, x_k\rangle - \gamma_k$, before the step the bound drops to
    $\max(c_k / (2\rho_k), f_\star^0)$ when $c_k = \rho_k(\bar f_k - \gamma_k) + \langle
    d_k, x_k\rangle$ is below $\rho_k f_\star$, and after it becomes
    $\max(h_k - \tfrac12 \tau_k \lVert d_k\rVert^2, f_\star^0)$, with $f_\star^0$ =
    `lower_bound`.

    Args:
        learning_rate: $\alpha$, the largest step (a number or a schedule of the global
            step); MoMo is meant to run with a large one.
        beta: $\beta$, the momentum of the averages.
        lower_bound: $f_\star$, a lower bound of the loss (0 for most losses).
        weight_decay: $\lambda$.
        adapt_lower_bound: estimate the lower bound on the fly.

    State:
        `exp_avg/<path>` ($d$) shaped like the parameter; global, by name: `barf`
        ($\bar f$), `gamma`, `lb` (the lower bound in use; float32) and `count` (int32),
        which advance at every update. Sums run over the paths present in the update.

    Examples:
        >>> tx = gradtx.contrib.momo()
        >>> params = {"w": jnp.array([1.0, 2.0, 3.0])}
        >>> loss, grads = jax.value_and_grad(lambda p: jnp.sum(p["w"] ** 2))(params)
        >>> u, state = tx.update(grads, tx.init(params), params, value=loss)
        >>> u["w"]  # the Polyak step f / |g|^2 = 1/4 along g
        Array([-0.5, -1. , -1.5], dtype=float32)

    References:
        Schaipp, Ohana, Eickenberg, Defazio & Gower, "MoMo: Momentum Models for Adaptive
        Learning Rates", ICML 2024.
    """
    return Momo(learning_rate, beta, lower_bound, weight_decay, adapt_lower_bound)


class MomoAdam(MomoStep):
    """MoMo-Adam: Adam with an adaptive step size (see `momo_adam`)."""

    name: ClassVar[str] = "momo_adam"
    learning_rate: Any = hyperparam(1e-2, required=True)
    b1: Any = hyperparam(0.9, check=decay_rate)
    b2: Any = hyperparam(0.999, check=decay_rate)
    eps: Any = hyperparam(1e-8, check=non_negative)
    lower_bound: Any = hyperparam(0.0)
    weight_decay: Any = hyperparam(0.0, check=non_negative)
    adapt_lower_bound: bool = static(False)

    def slot_keys(self) -> tuple[str, ...]:
        """Adam's moments `exp_avg` and `exp_avg_sq` of each path."""
        return ("exp_avg", "exp_avg_sq")

    def decays(self, count: Any) -> tuple[Any, Any, Any]:
        """`b1`, and the bias corrections of both moments at step `count + 1`."""
        t = (count + 1).astype(jnp.float32)
        return self.b1, bias_correction(self.b1, t), bias_correction(self.b2, t)

    def moments(self, grad: Any, slots: dict, beta: Any, dtype: Any) -> dict:
        """The momentum and the second moment of one array, as stored."""
        b2, v = self.b2.astype(dtype), slots["exp_avg_sq"]
        nu = as_stored(b2 * v.astype(dtype) + (1 - b2) * grad * grad, v)
        return {**super().moments(grad, slots, beta, dtype), "exp_avg_sq": nu}

    def direction(self, moments: dict, dtype: Any, bc2: Any) -> Any:
        """The momentum over `eps + sqrt(v / bc2)`."""
        v = moments["exp_avg_sq"]
        return moments["exp_avg"] / (self.eps.astype(dtype) + jnp.sqrt(v / bc2.astype(dtype)))


def momo_adam(
    learning_rate: ScalarOrSchedule = 1e-2,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    lower_bound: float = 0.0,
    weight_decay: float = 0.0,
    adapt_lower_bound: bool = False,
) -> MomoAdam:
    r"""MoMo-Adam: Adam's direction with MoMo's adaptive step size.

    Call `update` with the loss as `value`. Over all present paths together, with $k$ the
    global step (from 1), averages started at zero and $\beta_1$ also averaging the loss and
    $\langle g, x\rangle$:

    $$d_k = \beta_1 d_{k-1} + (1-\beta_1) g_k,\quad
      v_k = \beta_2 v_{k-1} + (1-\beta_2) g_k^2,\quad
      D_k = \epsilon + \sqrt{v_k / (1-\beta_2^k)}$$

    $$\bar f_k = \beta_1 \bar f_{k-1} + (1-\beta_1) f(x_k),\quad
      \gamma_k = \beta_1\gamma_{k-1} + (1-\beta_1)\langle g_k, x_k\rangle,\quad
      b_k = 1 - \beta_1^k$$

    $$\tau_k = \min\Big(\frac{\alpha_k}{b_k},\ \frac{\big(\rho_k(\bar f_k - b_k f_\star -
      \gamma_k) + \langle d_k, x_k\rangle\big)_+}{\lVert d_k\rVert^2_{D_k^{-1}}}\Big),\qquad
      x_{k+1} = \frac{x_k - \tau_k\, d_k / D_k}{\rho_k}$$

    with $\rho_k = 1 + \alpha_k\lambda$ and $\lVert d\rVert^2_{D^{-1}} = \sum d^2 / D$;
    $\tau_k = 0$ where that norm is below float64's machine epsilon. As in `momo`, the weight
    decay is the paper's proximal step, and `adapt_lower_bound` estimates $f_\star$ (the
    bounds there are divided by $b_k$). The update is already a descent step.

    Args:
        learning_rate: $\alpha$, a number or a schedule of the global step.
        b1: $\beta_1$, the decay of the momentum and of the averaged loss.
        b2: $\beta_2$, the decay of the second moment.
        eps: $\epsilon$, added to the preconditioner.
        lower_bound: $f_\star$, a lower bound of the loss.
        weight_decay: $\lambda$.
        adapt_lower_bound: estimate the lower bound on the fly.

    State:
        `exp_avg/<path>` and `exp_avg_sq/<path>` shaped like the parameter; global, by
        name: `barf`, `gamma`, `lb` (float32) and `count` (int32).

    Examples:
        >>> tx = gradtx.contrib.momo_adam()
        >>> params = {"w": jnp.array([1.0, 2.0])}
        >>> loss, grads = jax.value_and_grad(lambda p: jnp.sum(p["w"] ** 2))(params)
        >>> u, state = tx.update(grads, tx.init(params), params, value=loss)
        >>> u["w"]  # capped by the learning rate: an Adam step of size 0.01
        Array([-0.01, -0.01], dtype=float32)

    References:
        Schaipp, Ohana, Eickenberg, Defazio & Gower, "MoMo: Momentum Models for Adaptive
        Learning Rates", ICML 2024.
    """
    return MomoAdam(learning_rate, b1, b2, eps, lower_bound, weight_decay, adapt_lower_bound)
