"""Registry entries of the optimizer catalogue (see `registry.Entry`): sign-based and
miscellaneous transformations and their optimizers."""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import optax
import references as ref
import references_misc as rm
from registry import Entry, _f, is_w, optax_w_mask

import gradtx
from gradtx import schedules

LR_SWEEP = (0.02, 0.05, 0.1)
MONITORED = ("global_norm", "max_abs", "nonfinite_count", "norm", "update_ratio")


# --- the Polyak step needs the loss: the contract's quadratic, passed as `value` ---------------


def _curvature(n: int) -> np.ndarray:
    return np.linspace(0.5, 2.0, max(n, 1))


def _target(path: str) -> float:
    return 0.3 if path.endswith("b") else 1.0


def contract_loss(params: Any) -> jax.Array:
    """The contract suite's quadratic, `sum 0.5 * a * (p - c)^2`, in float32."""
    if isinstance(params, gradtx.Packed):
        params = params.unpack()
    total = jnp.zeros((), jnp.float32)
    for kp, p in jax.tree_util.tree_flatten_with_path(params)[0]:
        path = jax.tree_util.keystr(kp, simple=True, separator="/")
        a = jnp.asarray(_curvature(p.size), jnp.float32).reshape(p.shape)
        total = total + jnp.sum(0.5 * a * (p.astype(jnp.float32) - _target(path)) ** 2)
    return total


def reference_loss(params: dict[str, np.ndarray]) -> float:
    """The same quadratic over flat float64 params."""
    total = 0.0
    for path, p in params.items():
        a = _curvature(np.size(p)).reshape(np.shape(p))
        total += float(np.sum(0.5 * a * (np.asarray(p, np.float64) - _target(path)) ** 2))
    return total


class WithLoss(gradtx.Transformation):
    """Runs `inner` with `value=contract_loss(params)`: the contract calls `update` without a
    loss, and a Polyak step needs one."""

    name: ClassVar[str] = "with_loss"
    inner: Any = None

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        if params is None:
            raise ValueError("scale_by_polyak in the contract needs the params (for the loss).")
        extra = {**extra, "value": contract_loss(params)}
        return self.inner.update(updates, state, params, **extra)


class OptaxWithLoss:
    """The optax oracle, given the same loss as `value`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def init(self, params: Any) -> Any:
        return self.inner.init(params)

    def update(self, updates: Any, state: Any, params: Any = None) -> Any:
        return self.inner.update(updates, state, params, value=contract_loss(params))


# --- entries ------------------------------------------------------------------------------------


MISC: tuple[Entry, ...] = (
    Entry(
        id="scale_by_lion",
        name="scale_by_lion",
        make=lambda b1: gradtx.scale_by_lion(b1=b1),
        reference=lambda b1: rm.scale_by_lion(b1=b1),
        oracle=lambda b1: optax.scale_by_lion(b1=_f(b1), b2=_f(0.99)),
        scalar=0.9,
        sweep=(0.1, 0.5, 0.99),
        converges=False,
        with_state_dtype=lambda b1, dt: gradtx.scale_by_lion(b1=b1, mu_dtype=dt),
    ),
    Entry(
        id="scale_by_sign",
        name="scale_by_sign",
        make=lambda s: gradtx.scale_by_sign(),
        reference=lambda s: rm.scale_by_sign(),
        oracle=lambda s: optax.scale_by_sign(),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        uses_scalar=False,
    ),
    Entry(
        # optax 0.2.8 returns the previous step's update (google-deepmind/optax#1725): no oracle.
        id="scale_by_rprop",
        name="scale_by_rprop",
        make=lambda eta_plus: gradtx.scale_by_rprop(0.1, eta_plus=eta_plus),
        reference=lambda eta_plus: rm.scale_by_rprop(0.1, eta_plus=eta_plus),
        oracle=None,
        scalar=1.2,
        sweep=(1.1, 1.2, 1.5),
        converges=False,
    ),
    Entry(
        id="scale_by_polyak",
        name="scale_by_polyak",
        make=lambda m: WithLoss(gradtx.scale_by_polyak(max_learning_rate=m)),
        reference=lambda m: rm.scale_by_polyak(reference_loss, max_learning_rate=m),
        oracle=lambda m: OptaxWithLoss(optax.scale_by_polyak(max_learning_rate=_f(m))),
        scalar=0.5,
        sweep=(0.05, 0.2, 0.5),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="scale_by_polyak-sps+",
        name="scale_by_polyak",
        make=lambda f_min: WithLoss(gradtx.scale_by_polyak(f_min=f_min, variant="sps+")),
        reference=lambda f_min: rm.scale_by_polyak(reference_loss, f_min=f_min, variant="sps+"),
        oracle=lambda f_min: OptaxWithLoss(
            optax.scale_by_polyak(f_min=_f(f_min), max_learning_rate=_f(1.0), variant="sps+")
        ),
        scalar=1.0,
        sweep=(0.0, 1.0, 10.0),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="ema",
        name="ema",
        make=lambda d: gradtx.ema(d),
        reference=lambda d: rm.ema(d),
        oracle=lambda d: optax.ema(_f(d)),
        scalar=0.9,
        sweep=(0.5, 0.8, 0.9),
        converges=False,
        with_state_dtype=lambda d, dt: gradtx.ema(d, accumulator_dtype=dt),
    ),
    Entry(
        id="ema-no_debias",
        name="ema",
        make=lambda d: gradtx.ema(d, debias=False),
        reference=lambda d: rm.ema(d, debias=False),
        oracle=lambda d: optax.ema(_f(d), debias=False),
        scalar=0.9,
        sweep=(0.5, 0.8, 0.9),
        converges=False,
        with_state_dtype=lambda d, dt: gradtx.ema(d, debias=False, accumulator_dtype=dt),
    ),
    Entry(
        id="centralize",
        name="centralize",
        make=lambda s: gradtx.centralize(),
        reference=lambda s: rm.centralize(),
        oracle=lambda s: optax.centralize(),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        uses_scalar=False,
    ),
    Entry(
        # Different random streams from optax's: no oracle. The reference draws the noise
        # from the key stream the docstring documents and checks the rest of the math.
        id="add_noise",
        name="add_noise",
        make=lambda eta: gradtx.add_noise(eta, 0.55, seed=3),
        reference=lambda eta: rm.add_noise(eta, 0.55, seed=3),
        oracle=None,
        scalar=0.01,
        sweep=(0.001, 0.01, 0.1),
        converges=False,
        packed=False,
    ),
    Entry(
        id="normalize_by_update_norm",
        name="normalize_by_update_norm",
        make=lambda s: gradtx.normalize_by_update_norm(s),
        reference=lambda s: rm.normalize_by_update_norm(s),
        oracle=lambda s: optax.normalize_by_update_norm(_f(s), _f(1e-6)),
        scalar=0.5,
        sweep=(0.25, 0.5, 2.0),
        converges=False,
    ),
    Entry(
        id="zero_nans",
        name="zero_nans",
        make=lambda s: gradtx.zero_nans(),
        reference=lambda s: rm.zero_nans(),
        oracle=lambda s: optax.zero_nans(),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        uses_scalar=False,
    ),
    Entry(
        id="keep_params_nonnegative",
        name="keep_params_nonnegative",
        make=lambda s: gradtx.keep_params_nonnegative(),
        reference=lambda s: rm.keep_params_nonnegative(),
        oracle=lambda s: optax.keep_params_nonnegative(),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=False,
        needs_params=True,
        uses_scalar=False,
    ),
    Entry(
        id="chain-sgd-keep_params_nonnegative",
        name="keep_params_nonnegative",
        make=lambda lr: gradtx.chain(gradtx.sgd(lr), gradtx.keep_params_nonnegative()),
        reference=lambda lr: ref.chain(ref.sgd(lr), rm.keep_params_nonnegative()),
        oracle=lambda lr: optax.chain(optax.sgd(_f(lr)), optax.keep_params_nonnegative()),
        scalar=0.5,
        sweep=(0.1, 0.5, 1.0),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="scale_by_optimistic_gradient",
        name="scale_by_optimistic_gradient",
        make=lambda b: gradtx.scale_by_optimistic_gradient(beta=b),
        reference=lambda b: rm.scale_by_optimistic_gradient(beta=b),
        oracle=lambda b: optax.scale_by_optimistic_gradient(alpha=_f(1.0), beta=_f(b)),
        scalar=1.0,
        sweep=(0.5, 1.0, 2.0),
        converges=False,
    ),
    Entry(
        id="scale_by_novograd",
        name="scale_by_novograd",
        make=lambda b1: gradtx.scale_by_novograd(b1=b1),
        reference=lambda b1: rm.scale_by_novograd(b1=b1),
        oracle=lambda b1: optax.scale_by_novograd(b1=_f(b1), b2=_f(0.25), eps=_f(1e-8)),
        scalar=0.9,
        sweep=(0.5, 0.8, 0.9),
        converges=False,
        packed=False,
    ),
    Entry(
        id="scale_by_novograd-weight_decay",
        name="scale_by_novograd",
        make=lambda wd: gradtx.scale_by_novograd(b2=0.5, eps=1e-6, weight_decay=wd),
        reference=lambda wd: rm.scale_by_novograd(b2=0.5, eps=1e-6, weight_decay=wd),
        oracle=lambda wd: optax.scale_by_novograd(
            b1=_f(0.9), b2=_f(0.5), eps=_f(1e-6), weight_decay=_f(wd)
        ),
        scalar=0.1,
        sweep=(0.01, 0.1, 0.5),
        converges=False,
        needs_params=True,
        packed=False,
    ),
    # --- optimizers ---
    Entry(
        id="lion-mask",
        name="lion",
        make=lambda lr: gradtx.lion(lr, weight_decay=0.1, mask="**/w"),
        reference=lambda lr: rm.lion(lr, weight_decay=0.1, mask=is_w),
        oracle=lambda lr: optax.lion(
            _f(lr), b1=_f(0.9), b2=_f(0.99), weight_decay=_f(0.1), mask=optax_w_mask
        ),
        scalar=0.03,
        sweep=(0.01, 0.03, 0.05),
        converges=True,
        needs_params=True,
        with_state_dtype=lambda lr, dt: gradtx.lion(lr, weight_decay=0.1, mask="**/w", mu_dtype=dt),
    ),
    Entry(
        id="lion-schedule",
        name="lion",
        make=lambda lr: gradtx.lion(schedules.cosine_decay(lr, 15, alpha=0.5)),
        reference=lambda lr: rm.lion(ref.cosine_decay_schedule(lr, 15, 0.5)),
        oracle=lambda lr: optax.lion(
            optax.cosine_decay_schedule(_f(lr), 15, alpha=_f(0.5)),
            b1=_f(0.9),
            b2=_f(0.99),
            weight_decay=_f(1e-3),
        ),
        scalar=0.03,
        sweep=(0.01, 0.03, 0.05),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="sign_sgd",
        name="sign_sgd",
        make=lambda lr: gradtx.sign_sgd(lr),
        reference=lambda lr: rm.sign_sgd(lr),
        oracle=lambda lr: optax.sign_sgd(_f(lr)),
        scalar=0.03,
        sweep=(0.01, 0.03, 0.05),
        converges=True,
    ),
    Entry(
        id="signum",
        name="signum",
        make=lambda lr: gradtx.signum(lr),
        reference=lambda lr: rm.signum(lr),
        oracle=lambda lr: optax.signum(_f(lr), beta=_f(0.9)),
        scalar=0.03,
        sweep=(0.01, 0.03, 0.05),
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.signum(lr, accumulator_dtype=dt),
    ),
    Entry(
        id="rprop",
        name="rprop",
        make=lambda eta_minus: gradtx.rprop(0.05, eta_minus=eta_minus),
        reference=lambda eta_minus: rm.rprop(0.05, eta_minus=eta_minus),
        oracle=None,  # see scale_by_rprop
        scalar=0.5,
        sweep=(0.3, 0.5, 0.7),
        converges=True,
    ),
    Entry(
        id="noisy_sgd",
        name="noisy_sgd",
        make=lambda lr: gradtx.noisy_sgd(lr, seed=5),
        reference=lambda lr: rm.noisy_sgd(lr, seed=5),
        oracle=None,  # see add_noise
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
        packed=False,
    ),
    Entry(
        id="polyak_sgd",
        name="polyak_sgd",
        make=lambda m: WithLoss(gradtx.polyak_sgd(max_learning_rate=m)),
        reference=lambda m: rm.polyak_sgd(reference_loss, max_learning_rate=m),
        oracle=lambda m: OptaxWithLoss(optax.polyak_sgd(max_learning_rate=_f(m))),
        scalar=1.0,
        sweep=(0.05, 0.2, 1.0),
        converges=True,
        needs_params=True,
    ),
    Entry(
        id="optimistic_gradient_descent",
        name="optimistic_gradient_descent",
        make=lambda lr: gradtx.optimistic_gradient_descent(lr),
        reference=lambda lr: rm.optimistic_gradient_descent(lr),
        oracle=lambda lr: optax.optimistic_gradient_descent(_f(lr), _f(1.0), _f(1.0)),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
    ),
    Entry(
        id="novograd",
        name="novograd",
        make=lambda lr: gradtx.novograd(lr),
        reference=lambda lr: rm.novograd(lr),
        oracle=lambda lr: optax.novograd(_f(lr), b1=_f(0.9), b2=_f(0.25), eps=_f(1e-6)),
        scalar=0.01,
        sweep=(0.005, 0.01, 0.02),
        converges=True,
        packed=False,
    ),
    Entry(
        id="fromage",
        name="fromage",
        make=lambda lr: gradtx.fromage(lr),
        reference=lambda lr: rm.fromage(lr),
        # a Python float: optax then computes 1/sqrt(1 + lr^2) - 1 in double precision
        oracle=lambda lr: optax.fromage(float(_f(lr))),
        scalar=0.01,
        sweep=(0.005, 0.01, 0.02),
        converges=True,
        needs_params=True,
    ),
    Entry(
        id="fromage-schedule",
        name="fromage",
        make=lambda lr: gradtx.fromage(schedules.linear(lr, 0.5 * lr, 10)),
        reference=lambda lr: rm.fromage(ref.linear_schedule(lr, 0.5 * ref.f32(lr), 10)),
        oracle=None,  # optax's schedule branch is the same chain; the float one is checked
        scalar=0.01,
        sweep=(0.005, 0.01, 0.02),
        converges=False,
        needs_params=True,
    ),
    Entry(
        id="nesterov",
        name="nesterov",
        make=lambda lr: gradtx.nesterov(lr),
        reference=lambda lr: rm.nesterov(lr),
        oracle=lambda lr: optax.sgd(_f(lr), momentum=_f(0.9), nesterov=True),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.nesterov(lr, accumulator_dtype=dt),
    ),
    # Every statistic recorded in front of a plain SGD step: the updates must pass unchanged
    # (the reference is the SGD step alone) through jit, scan, vmap, donation and bf16.
    Entry(
        id="monitor-all",
        name="monitor",
        make=lambda lr: gradtx.chain(gradtx.monitor("grad", MONITORED), gradtx.scale(-lr)),
        reference=lambda lr: ref.scale(-lr),
        oracle=lambda lr: optax.scale(-_f(lr)),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
        needs_params=True,
        packed=False,
    ),
)
