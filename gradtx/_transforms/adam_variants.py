"""Adam's relatives: AMSGrad, AdaMax, AdaBelief, RAdam, Yogi and Adan."""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp

from gradtx._core.lift import as_stored, dtype_or_none, zeros_for
from gradtx._core.module import decay_rate, hyperparam, non_negative, static
from gradtx._core.per_array import Float16Check
from gradtx._transforms.adam import AdamArgs, AdamMoments, first_moment_hat, moving_average
from gradtx._transforms.rms import filled_for
from gradtx._transforms.shared_args import with_shared_args


class ScaleByAmsgrad(AdamArgs):
    """Adam with the running maximum of the second moment (see `scale_by_amsgrad`)."""

    name: ClassVar[str] = "scale_by_amsgrad"
    float16_check: ClassVar[Float16Check] = Float16Check(
        ("nu", "nu_max"), "the second moments", "nu_dtype"
    )
    bias_correction_mu: bool = static(True)
    bias_correction_nu: bool = static(True)

    def state_keys(self) -> tuple[str, ...]:
        """`mu`, `nu`, the running maximum `nu_max` and the path's step `count`."""
        return ("mu", "nu", "nu_max", "count")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Zero moments and maximum, count 0."""
        return {**super().init_leaf(param), "nu_max": zeros_for(param, self.nu_dtype)}

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """One AMSGrad step for one array, computed in at least float32."""
        dtype, grad, b1, b2, mu, count, t = self.moments(g, slots)
        nu = moving_average(b2, slots["nu"], grad * grad, dtype)
        mu_hat = mu / (1 - b1**t) if self.bias_correction_mu else mu
        nu_hat = nu / (1 - b2**t) if self.bias_correction_nu else nu
        nu_max = as_stored(jnp.maximum(slots["nu_max"].astype(dtype), nu_hat), slots["nu_max"])
        u = self.adam_step(mu_hat, nu_max, dtype)
        return u, {"mu": mu, "nu": nu, "nu_max": nu_max, "count": count}


class ScaleByAdamax(AdamMoments):
    """Adam with the infinity norm (see `scale_by_adamax`)."""

    name: ClassVar[str] = "scale_by_adamax"
    # Not squared, but `eps` (1e-8) rounds to zero in float16, so a zero gradient gives 0/0.
    float16_check: ClassVar[Float16Check] = Float16Check(
        ("nu",),
        "the infinity norm",
        "nu_dtype",
        why="where a small `eps` rounds to zero and a zero gradient gives 0/0 (NaN)",
    )
    b1: Any = hyperparam(0.9, check=decay_rate)
    b2: Any = hyperparam(0.999, check=decay_rate)
    eps: Any = hyperparam(1e-8, check=non_negative)
    mu_dtype: Any = static(None, converter=dtype_or_none)
    nu_dtype: Any = static(None, converter=dtype_or_none)

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """One AdaMax step for one array, computed in at least float32."""
        dtype, grad, b1, b2, mu, count, t = self.moments(g, slots)
        eps = self.eps.astype(dtype)
        nu = as_stored(
            jnp.maximum(jnp.abs(grad) + eps, b2 * slots["nu"].astype(dtype)), slots["nu"]
        )
        u = mu / (1 - b1**t) / nu
        return u, {"mu": mu, "nu": nu, "count": count}


class ScaleByBelief(AdamArgs):
    """AdaBelief's rescaling (see `scale_by_belief`)."""

    name: ClassVar[str] = "scale_by_belief"
    eps: Any = hyperparam(1e-16, check=non_negative)
    eps_root: Any = hyperparam(1e-16, check=non_negative)
    nesterov: bool = static(False)

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """One AdaBelief step for one array, computed in at least float32."""
        dtype, grad, b1, b2, mu, count, t = self.moments(g, slots)
        error = grad - mu
        eps, eps_root = self.eps.astype(dtype), self.eps_root.astype(dtype)
        # eps_root joins the decayed moment first: summed last, it led XLA's CPU compiler to
        # recompute the new moment in the update's kernel from the old one, which a donated
        # step then had to copy (a pass over `nu` more per step).
        nu_new = (1 - b2) * (error * error) + (b2 * slots["nu"].astype(dtype) + eps_root)
        nu = as_stored(nu_new, slots["nu"])
        mu_hat = first_moment_hat(mu, grad, b1, t, self.nesterov)
        u = mu_hat / (jnp.sqrt(nu / (1 - b2**t)) + eps)
        return u, {"mu": mu, "nu": nu, "count": count}


def _bernoulli_ratio_difference(t: Any, x: Any) -> Any:
    """`rho_t` by its series in `x = -log(b2)`, accurate while `t * x <= 1`.

    rho_t = t - (t^2 - 1) x / 6 + (t^4 - 1) x^3 / 360 - (t^6 - 1) x^5 / 15120
            + (t^8 - 1) x^7 / 604800 - ...
    (from y / (e^y - 1) = sum_n B_n y^n / n!), with no cancellation for b2 near 1.
    """
    t2 = t * t
    x2 = x * x
    series = (
        (t2 - 1) / 6
        - (t2 * t2 - 1) * x2 / 360
        + (t2 * t2 * t2 - 1) * (x2 * x2) / 15120
        - (t2 * t2 * t2 * t2 - 1) * (x2 * x2 * x2) / 604800
    )
    return t - series * x


def radam_rho(b2: Any, t: Any) -> Any:
    r"""RAdam's length of the approximated SMA, $\rho_t = \rho_\infty - 2t\beta_2^t/(1-\beta_2^t)$.

    The two terms nearly cancel for small $t$ and $\beta_2$ near 1 (for $\beta_2 = 0.999$,
    $\rho_\infty \approx 2000$ while $\rho_6 \approx 6$), so float32 arithmetic on the formula
    as written loses four digits. Here small $t$ uses its series in $x = -\log\beta_2$ and
    large $t$ (where nothing cancels) the formula, with $1-\beta_2^t$ from `expm1`.
    """
    x = -jnp.log1p(-(1 - b2))
    tx = t * x
    small = tx <= 1
    ts = jnp.where(small, t, jnp.ones_like(t))  # keeps the unused series finite
    series = _bernoulli_ratio_difference(ts, x)
    one_minus = -jnp.expm1(-tx)
    direct = (2 / (1 - b2) - 1) - 2 * t * jnp.exp(-tx) / one_minus
    return jnp.where(small, series, direct)


class ScaleByRadam(AdamMoments):
    """Rectified Adam's rescaling (see `scale_by_radam`)."""

    name: ClassVar[str] = "scale_by_radam"
    b1: Any = hyperparam(0.9, check=decay_rate)
    b2: Any = hyperparam(0.999, check=decay_rate)
    eps: Any = hyperparam(1e-8, check=non_negative)
    eps_root: Any = hyperparam(0.0, check=non_negative)
    threshold: Any = hyperparam(5.0)
    mu_dtype: Any = static(None, converter=dtype_or_none)
    nu_dtype: Any = static(None, converter=dtype_or_none)
    nesterov: bool = static(False)

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """One RAdam step for one array, computed in at least float32."""
        dtype, grad, b1, b2, mu, count, t = self.moments(g, slots)
        nu = moving_average(b2, slots["nu"], grad * grad, dtype)
        mu_hat = first_moment_hat(mu, grad, b1, t, self.nesterov)
        nu_hat = nu / (1 - b2**t)
        rho_inf = 2 / (1 - b2) - 1
        rho = radam_rho(b2, t)
        rectified = rho >= self.threshold.astype(dtype)
        rho_safe = jnp.where(rectified, rho, rho_inf)  # r = 1: finite when not rectified
        r = jnp.sqrt(
            (rho_safe - 4) * (rho_safe - 2) * rho_inf / ((rho_inf - 4) * (rho_inf - 2) * rho_safe)
        )
        u = jnp.where(rectified, self.adam_step(r * mu_hat, nu_hat, dtype), mu_hat)
        return u, {"mu": mu, "nu": nu, "count": count}


class ScaleByYogi(AdamMoments):
    """Yogi's rescaling (see `scale_by_yogi`)."""

    name: ClassVar[str] = "scale_by_yogi"
    b1: Any = hyperparam(0.9, check=decay_rate)
    b2: Any = hyperparam(0.999, check=decay_rate)
    eps: Any = hyperparam(1e-3, check=non_negative)
    eps_root: Any = hyperparam(0.0, check=non_negative)
    initial_accumulator_value: Any = hyperparam(1e-6)
    mu_dtype: Any = static(None, converter=dtype_or_none)
    nu_dtype: Any = static(None, converter=dtype_or_none)

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Both moments filled with `initial_accumulator_value`, count 0."""
        v = self.initial_accumulator_value
        return {
            "mu": filled_for(param, v, self.mu_dtype),
            "nu": filled_for(param, v, self.nu_dtype),
            "count": jnp.zeros((), jnp.int32),
        }

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """One Yogi step for one array, computed in at least float32."""
        dtype, grad, b1, b2, mu, count, t = self.moments(g, slots)
        old_nu, g2 = slots["nu"].astype(dtype), grad * grad
        nu = as_stored(old_nu - (1 - b2) * jnp.sign(old_nu - g2) * g2, slots["nu"])
        u = self.adam_step(mu / (1 - b1**t), nu / (1 - b2**t), dtype)
        return u, {"mu": mu, "nu": nu, "count": count}


class ScaleByAdan(AdamMoments):
    """Adan's rescaling (see `scale_by_adan`)."""

    name: ClassVar[str] = "scale_by_adan"
    b1: Any = hyperparam(0.98, check=decay_rate)
    b2: Any = hyperparam(0.92, check=decay_rate)
    b3: Any = hyperparam(0.99, check=decay_rate)
    eps: Any = hyperparam(1e-8, check=non_negative)
    eps_root: Any = hyperparam(0.0, check=non_negative)
    mu_dtype: Any = static(None, converter=dtype_or_none)
    nu_dtype: Any = static(None, converter=dtype_or_none)

    def state_keys(self) -> tuple[str, ...]:
        """`mu`, `delta` (of gradient differences), `nu`, `prev_grad` and `count`."""
        return ("mu", "delta", "nu", "prev_grad", "count")

    def init_leaf(self, param: Any) -> dict[str, Any]:
        """Zero moments and previous gradient, count 0."""
        return {
            "mu": zeros_for(param, self.mu_dtype),
            "delta": zeros_for(param, self.mu_dtype),
            "nu": zeros_for(param, self.nu_dtype),
            "prev_grad": zeros_for(param, self.mu_dtype),
            "count": jnp.zeros((), jnp.int32),
        }

    def update_leaf(self, g: Any, slots: dict, param: Any) -> tuple[Any, dict]:
        """One Adan step for one array, computed in at least float32."""
        dtype, grad, b1, b2, mu, count, t = self.moments(g, slots)
        b3 = self.b3.astype(dtype)
        first = count == 1
        diff = jnp.where(first, jnp.zeros_like(grad), grad - slots["prev_grad"].astype(dtype))
        delta = moving_average(b2, slots["delta"], diff, dtype)
        mixed = grad + (1 - b2) * diff
        nu = moving_average(b3, slots["nu"], mixed * mixed, dtype)
        direction = mu / (1 - b1**t) + (1 - b2) * delta / (1 - b2**t)
        u = self.adam_step(direction, nu / (1 - b3**t), dtype)
        new = {"mu": mu, "delta": delta, "nu": nu, "prev_grad": grad, "count": count}
        return u, new


@with_shared_args
def scale_by_amsgrad(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
    bias_correction_mu: bool = True,
    bias_correction_nu: bool = True,
) -> ScaleByAmsgrad:
    r"""Rescale updates by AMSGrad: Adam with the running maximum of the second moment.

    Per path, with step $t$ counted per path, $m, v$ as in `scale_by_adam` and

    $$\hat v^{\max}_t = \max(\hat v^{\max}_{t-1}, \hat v_t),\qquad
      u_t = \hat m_t / (\sqrt{\hat v^{\max}_t + \epsilon_{root}} + \epsilon)$$

    where $\hat m_t = m_t/(1-\beta_1^t)$ and $\hat v_t = v_t/(1-\beta_2^t)$ (or the raw
    moments with `bias_correction_mu=False` / `bias_correction_nu=False`, as in the paper).
    The maximum never decreases, so the effective step size never grows.

    Args:
        nu_dtype: dtype of `nu` and `nu_max` (default: the parameter's dtype).
        bias_correction_mu: divide the first moment by $1-\beta_1^t$.
        bias_correction_nu: divide the second moment by $1-\beta_2^t$ before the maximum.

    State:
        `mu/<path>`, `nu/<path>`, `nu_max/<path>` shaped like the parameter; `count/<path>`
        an int32 scalar.

    Examples:
        >>> tx = gradtx.scale_by_amsgrad()
        >>> state = tx.init({"w": jnp.zeros(1)})
        >>> _, state = tx.update({"w": jnp.array([3.0])}, state)
        >>> _, state = tx.update({"w": jnp.array([0.0])}, state)
        >>> state["nu_max"]["w"] >= state["nu"]["w"] / (1 - 0.999**2)
        Array([ True], dtype=bool)

    References:
        Reddi, Kale & Kumar, "On the Convergence of Adam and Beyond", 2018.
    """
    return ScaleByAmsgrad(
        b1, b2, eps, eps_root, mu_dtype, nu_dtype, bias_correction_mu, bias_correction_nu
    )


@with_shared_args
def scale_by_adamax(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> ScaleByAdamax:
    r"""Rescale updates by AdaMax: Adam with the infinity norm in place of the second moment.

    Per path, with step $t$ counted per path:

    $$m_t = \beta_1 m_{t-1} + (1-\beta_1) g_t,\quad
      v_t = \max(|g_t| + \epsilon,\ \beta_2 v_{t-1}),\quad
      u_t = \frac{m_t}{(1-\beta_1^t)\, v_t}$$

    The infinity norm needs no bias correction. As in optax, $\epsilon$ is added to $|g_t|$
    inside the maximum (the paper has no $\epsilon$).

    Args:
        b2: decay of the exponentially weighted infinity norm.
        eps: added to $|g_t|$, so the denominator is never zero.

    State:
        `mu/<path>`, `nu/<path>` (the infinity norm) shaped like the parameter;
        `count/<path>` an int32 scalar.

    Examples:
        >>> tx = gradtx.scale_by_adamax()
        >>> u, _ = tx.update({"w": jnp.array([4.0, -2.0])}, tx.init({"w": jnp.zeros(2)}))
        >>> u["w"]
        Array([ 1., -1.], dtype=float32)

    References:
        Kingma & Ba, "Adam: A Method for Stochastic Optimization", 2015 (section 7.1).
    """
    return ScaleByAdamax(b1, b2, eps, mu_dtype, nu_dtype)


@with_shared_args
def scale_by_belief(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-16,
    eps_root: float = 1e-16,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
    nesterov: bool = False,
) -> ScaleByBelief:
    r"""Rescale updates by AdaBelief: the second moment of the gradient's deviation from $m$.

    Per path, with step $t$ counted per path:

    $$m_t = \beta_1 m_{t-1} + (1-\beta_1) g_t,\quad
      s_t = \beta_2 s_{t-1} + (1-\beta_2)(g_t - m_t)^2 + \epsilon_{root}$$

    $$u_t = \hat m_t / (\sqrt{s_t/(1-\beta_2^t)} + \epsilon),\quad \hat m_t = m_t/(1-\beta_1^t)$$

    With `nesterov=True`, $\hat m_t$ is the Nesterov form of `scale_by_adam`. The defaults
    follow optax (`eps=eps_root=1e-16`); the paper uses `eps=1e-8, eps_root=0`.

    Args:
        b2: decay of the second moment of the prediction error $g_t - m_t$.
        eps_root: added to $s_t$ at every step (needed when differentiating through it).
        nu_dtype: dtype of `nu`, which holds $s$ (default: the parameter's dtype).

    State:
        `mu/<path>`, `nu/<path>` shaped like the parameter; `count/<path>` an int32 scalar.

    Examples:
        >>> tx = gradtx.scale_by_belief()
        >>> state = tx.init({"w": jnp.zeros(2)})
        >>> sorted(state)
        ['count', 'mu', 'nu']

    References:
        Zhuang et al., "AdaBelief Optimizer: Adapting Stepsizes by the Belief in Observed
        Gradients", 2020.
    """
    return ScaleByBelief(b1, b2, eps, eps_root, mu_dtype, nu_dtype, nesterov)


@with_shared_args
def scale_by_radam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    threshold: float = 5.0,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
    nesterov: bool = False,
) -> ScaleByRadam:
    r"""Rescale updates by Rectified Adam (RAdam).

    Per path, with step $t$ counted per path and $m, v, \hat m, \hat v$ as in
    `scale_by_adam`:

    $$\rho_\infty = \frac{2}{1-\beta_2} - 1,\quad
      \rho_t = \rho_\infty - \frac{2t\beta_2^t}{1-\beta_2^t},\quad
      r_t = \sqrt{\frac{(\rho_t-4)(\rho_t-2)\rho_\infty}{(\rho_\infty-4)(\rho_\infty-2)\rho_t}}$$

    $$u_t = r_t\,\hat m_t/(\sqrt{\hat v_t + \epsilon_{root}} + \epsilon)
      \ \text{ if } \rho_t \ge \text{threshold},\ \text{ else } u_t = \hat m_t$$

    While the variance of the adaptive rate is intractable (the first few steps; with the
    defaults, steps 1 to 5) the update is plain momentum. $\rho_t$ is computed without the
    cancellation of its two terms (a series in $-\log\beta_2$ for small $t$), so it is
    accurate in float32; optax evaluates the formula as written, whose float32 rounding
    changes the rectified steps by up to a few parts in $10^3$ for $\beta_2 = 0.999$.

    Args:
        threshold: the smallest $\rho_t$ at which the adaptive step is used.

    State:
        `mu/<path>`, `nu/<path>` shaped like the parameter; `count/<path>` an int32 scalar.

    Examples:
        >>> tx = gradtx.scale_by_radam()
        >>> u, _ = tx.update({"w": jnp.array([0.5])}, tx.init({"w": jnp.zeros(1)}))
        >>> u["w"]  # the first steps are momentum only
        Array([0.5], dtype=float32)

    References:
        Liu et al., "On the Variance of the Adaptive Learning Rate and Beyond", 2020.
    """
    return ScaleByRadam(b1, b2, eps, eps_root, threshold, mu_dtype, nu_dtype, nesterov)


@with_shared_args
def scale_by_yogi(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-3,
    eps_root: float = 0.0,
    initial_accumulator_value: float = 1e-6,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> ScaleByYogi:
    r"""Rescale updates by Yogi: Adam with an additive, sign-controlled second moment.

    Per path, with step $t$ counted per path and $m_0 = v_0 =$ `initial_accumulator_value`:

    $$m_t = \beta_1 m_{t-1} + (1-\beta_1) g_t,\quad
      v_t = v_{t-1} - (1-\beta_2)\,\mathrm{sign}(v_{t-1} - g_t^2)\,g_t^2$$

    $$u_t = \frac{m_t/(1-\beta_1^t)}{\sqrt{v_t/(1-\beta_2^t) + \epsilon_{root}} + \epsilon}$$

    $v$ moves by at most $(1-\beta_2) g_t^2$ per step, so a burst of large gradients raises
    it slowly. As in optax, both moments start at `initial_accumulator_value` and are still
    divided by the bias corrections.

    Args:
        b2: the rate of the second moment's additive update.
        initial_accumulator_value: the initial value of both moments.

    State:
        `mu/<path>`, `nu/<path>` shaped like the parameter; `count/<path>` an int32 scalar.

    Examples:
        >>> tx = gradtx.scale_by_yogi()
        >>> tx.init({"w": jnp.zeros(2)})["nu"]["w"]
        Array([1.e-06, 1.e-06], dtype=float32)

    References:
        Zaheer et al., "Adaptive Methods for Nonconvex Optimization", NeurIPS 2018.
    """
    return ScaleByYogi(b1, b2, eps, eps_root, initial_accumulator_value, mu_dtype, nu_dtype)


@with_shared_args
def scale_by_adan(
    b1: float = 0.98,
    b2: float = 0.92,
    b3: float = 0.99,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    *,
    mu_dtype: Any = None,
    nu_dtype: Any = None,
) -> ScaleByAdan:
    r"""Rescale updates by Adan, adaptive Nesterov momentum.

    Per path, with step $t$ counted per path and $\Delta_t = g_t - g_{t-1}$ ($\Delta_1 = 0$):

    $$m_t = \beta_1 m_{t-1} + (1-\beta_1) g_t,\quad
      d_t = \beta_2 d_{t-1} + (1-\beta_2)\Delta_t,\quad
      n_t = \beta_3 n_{t-1} + (1-\beta_3)\big(g_t + (1-\beta_2)\Delta_t\big)^2$$

    $$u_t = \frac{m_t/(1-\beta_1^t) + (1-\beta_2)\,d_t/(1-\beta_2^t)}
      {\sqrt{n_t/(1-\beta_3^t) + \epsilon_{root}} + \epsilon}$$

    The betas are decays, as in optax (the paper writes $1-\beta$: its $\beta_1 = 0.02$ is
    `b1=0.98` here). Each path's first step has $\Delta = 0$, including a path that starts
    receiving gradients later than others.

    Args:
        b2: decay of the moving average of gradient differences.
        b3: decay of the second moment.
        mu_dtype: dtype of `mu`, `delta` and `prev_grad` (default: the parameter's dtype).

    State:
        `mu/<path>`, `delta/<path>`, `nu/<path>` and `prev_grad/<path>` (the last gradient)
        shaped like the parameter; `count/<path>` an int32 scalar.

    Examples:
        >>> tx = gradtx.scale_by_adan()
        >>> u, _ = tx.update({"w": jnp.array([2.0])}, tx.init({"w": jnp.zeros(1)}))
        >>> u["w"]
        Array([1.], dtype=float32)

    References:
        Xie et al., "Adan: Adaptive Nesterov Momentum Algorithm for Faster Optimizing Deep
        Models", 2022.
    """
    return ScaleByAdan(b1, b2, b3, eps, eps_root, mu_dtype, nu_dtype)
