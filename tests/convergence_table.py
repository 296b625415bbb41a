"""The convergence table: how many steps every core optimizer takes on a parabola and on
Rosenbrock, and the problems it measures them on.

Each row is an optimizer with its hyperparameters (as written, evaluated to build it) and the
steps measured until the loss first falls below the tolerance, on four problems: the parabola
`sum([1, 10] * (x - 1)^2)` from 0 in float32, Rosenbrock from (0, 0) in float32, the same
parabola with bfloat16 params (default state dtype: the state follows the params), and the
complex parabola `sum([1, 10] * |z - c|^2)` with complex64 params (complex as pairs of reals;
the gradient passed is `conj(jax.grad(loss))`). tests/optimizers/test_convergence.py runs every
row and checks that docs/numerics.md shows the table; tests/core/test_state_dtypes.py steps
every optimizer of it.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

import gradtx
from gradtx import schedules

TOL = 1e-4
# bfloat16 params near 1 are spaced 2^-8 (below 1) and 2^-7 (above): a step smaller than half
# of that is rounded away, so the bf16 target is |x - 1| of about 0.03 on the stiff axis.
TOL_BF16 = 1e-2
NO = "no"  # does not reach the tolerance within NO_HORIZON steps: the reason is in a comment
SKIP = "-"  # not run with these hyperparameters (another row covers the problem)
NO_HORIZON = 5000

CURVATURE = jnp.array([1.0, 10.0])
TARGET = jnp.array([1 + 1j, 1 - 0.5j], jnp.complex64)


def parabola(p):
    return jnp.sum(CURVATURE * (p["x"].astype(jnp.float32) - 1) ** 2)


def rosenbrock(p):
    x, y = p["x"][0], p["x"][1]
    return (1 - x) ** 2 + 100 * (y - x * x) ** 2


def complex_parabola(p):
    r = p["x"] - TARGET
    return jnp.sum(CURVATURE * (r.real**2 + r.imag**2))


# problem -> (loss, params dtype, tolerance)
PROBLEMS = {
    "parabola": (parabola, jnp.float32, TOL),
    "rosenbrock": (rosenbrock, jnp.float32, TOL),
    "bf16": (parabola, jnp.bfloat16, TOL_BF16),
    "complex64": (complex_parabola, jnp.complex64, TOL),
}


@dataclasses.dataclass(frozen=True)
class Row:
    """An optimizer, its arguments as written, and its measured steps per problem."""

    optimizer: str
    args: str
    parabola: int | str
    rosenbrock: int | str
    bf16: int | str
    complex64: int | str

    def make(self):
        namespace = {"gradtx": gradtx, "schedules": schedules, "jnp": jnp}
        return eval(f"gradtx.{self.optimizer}({self.args})", namespace)

    def __str__(self) -> str:
        return f"{self.optimizer}({self.args})"


def decay(lr: float, steps: int) -> str:
    """A learning rate halving every `steps` steps, as written in the table."""
    return f"schedules.exponential_decay({lr}, {steps}, 0.5)"


TABLE = [
    # Rosenbrock: lr 0.04 is above 2 / (the valley's curvature), so plain SGD diverges there
    # (the next row converges with lr 1e-3).
    Row("sgd", "0.04", 56, NO, 28, 60),
    Row("sgd", "1e-3", SKIP, 8568, SKIP, SKIP),
    Row("sgd", "2e-3, momentum=0.9", 72, 379, 54, 104),
    Row("nesterov", "1e-3", 192, 817, 101, 205),
    Row("adam", "0.05", 24, 242, 23, 81),
    Row("adamw", "0.05, weight_decay=1e-4", 24, 242, 23, 81),
    # bf16: with the default bfloat16 state, `0.999 * nu` rounds back to `nu`, so the second
    # moment cannot decay and the steps shrink too early (float32 state: see the test below).
    Row("nadam", "0.01", 247, 429, 3806, 248),
    Row("nadamw", '0.01, weight_decay=1e-4, mask="x"', 247, 430, 3806, 248),
    Row("adamax", "0.05", 38, 510, 35, 91),
    Row("adamaxw", "0.05, weight_decay=1e-4", 38, 514, 35, 90),
    Row("amsgrad", "0.05", 39, 623, 35, 94),
    Row("adabelief", "0.02", 38, 231, 36, 109),
    Row("radam", "0.02", 368, 466, 800, 381),
    # bf16: Adagrad's steps shrink like 1/sqrt(t) and fall below half the bfloat16 spacing
    # near 1 before the stiff axis converges: the params stop moving (loss about 3.5e-2).
    Row("adagrad", "0.1", 169, 3290, NO, 171),
    # Rosenbrock: Adadelta (defaults: lr 1, eps 1e-6) starts with steps of about sqrt(eps)
    # and does not settle into Rosenbrock's valley in float32.
    Row("adadelta", "", 378, NO, 359, 378),
    Row("adafactor", "0.05, multiply_by_parameter_scale=False, momentum=0.9", 36, 75, 35, 83),
    Row("rmsprop", "3e-4, momentum=0.9", 366, 453, 330, 366),
    # Trust-ratio and sign methods take steps of a fixed relative (or absolute) size, so they
    # need a decaying learning rate to settle.
    Row("lamb", decay(0.05, 100), 109, 458, 80, 176),
    Row("lars", decay(0.05, 50) + ", trust_coefficient=1.0", 127, 335, 63, 148),
    Row("lion", decay(0.01, 200) + ", weight_decay=0.0", 267, 835, 116, 267),
    Row("yogi", "0.05", 24, 238, 24, 82),
    Row("adan", "0.05", 21, 80, 21, 325),
    Row("novograd", decay(0.05, 100), 294, 575, 32, 293),
    # Fromage's steps are relative to the parameter's norm, so from zero it first grows the
    # params geometrically; a decaying learning rate would stall it there: a constant one.
    Row("fromage", "0.02", 788, 2027, 778, 861),
    Row("sign_sgd", decay(0.01, 1000), 352, 9184, 111, 490),
    Row("signum", decay(0.05, 100), 61, 797, 21, 375),
    Row("rprop", "0.01", 25, 2157, 21, 29),
    # Rosenbrock: as for sgd, lr 0.04 diverges; the next row converges.
    Row("noisy_sgd", "0.04", 55, NO, 28, 63),
    Row("noisy_sgd", "1e-3", SKIP, 8576, SKIP, SKIP),
    Row("polyak_sgd", "", 21, 227, 10, 18),
    # Rosenbrock: as for sgd, lr 0.03 diverges; the next row converges.
    Row("optimistic_gradient_descent", "0.03", 80, NO, 41, 86),
    Row("optimistic_gradient_descent", "1e-3, beta=0.5", SKIP, 8571, SKIP, SKIP),
    # bf16: SM3's accumulators follow the params; with a constant rate the steps on the
    # stiff axis stay too large to settle within the bfloat16 tolerance (the next row does).
    Row("sm3", "0.1", 142, 534, NO, 143),
    Row("sm3", decay(0.3, 100), SKIP, SKIP, 16, SKIP),
    # Rosenbrock: lr 0.03 keeps oscillating across the valley; the next row converges.
    Row("optimistic_adam", "0.03", 50, NO, 47, 50),
    Row("optimistic_adam", "1.5e-3", SKIP, 1945, SKIP, SKIP),
    # L-BFGS with its zoom line search needs the loss: `update(..., value=, grad=, value_fn=)`.
    Row("lbfgs", "", 4, 14, 3, 5),
]
