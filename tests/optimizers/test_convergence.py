"""Every core optimizer converges in the steps the convergence table says
(tests/convergence_table.py), and docs/numerics.md shows that table.

A run is allowed about 1.5x the measured steps, so a regression that slows an optimizer down
fails; an optimizer that became much faster fails too, so the table (and docs/numerics.md,
which shows it) stays true.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from convergence_table import NO, NO_HORIZON, PROBLEMS, SKIP, TABLE, TOL, TOL_BF16
from registry import REGISTRY

import gradtx

# Slow (every optimizer run to convergence): left out of `make quick` (see CONTRIBUTING.md).
pytestmark = pytest.mark.slow

PAGE = Path(__file__).resolve().parents[2] / "docs" / "numerics.md"


def budget(steps: int) -> int:
    """About 1.5x the measured steps (at least 10 more)."""
    return max(math.ceil(1.5 * steps), steps + 10)


def steps_to_reach(tx, problem: str, horizon: int) -> int | None:
    """The first step after which the loss is below the problem's tolerance (None: never
    within `horizon` steps); one `lax.scan` under `jit`."""
    loss, dtype, tol = PROBLEMS[problem]

    @jax.jit
    def run(params):
        def body(carry, _):
            params, state = carry
            value, grads = jax.value_and_grad(loss)(params)
            if dtype == jnp.complex64:  # the descent direction of the pairs of reals
                grads = jax.tree.map(jnp.conj, grads)
            # The loss for the methods that read it (Polyak, line searches); others ignore it.
            updates, state = tx.update(grads, state, params, value=value, grad=grads, value_fn=loss)
            params = gradtx.apply_updates(params, updates)
            return (params, state), loss(params)

        return jax.lax.scan(body, (params, tx.init(params)), None, length=horizon)[1]

    losses = np.asarray(run({"x": jnp.zeros(2, dtype)}))
    hit = np.flatnonzero(losses < tol)
    return int(hit[0]) + 1 if hit.size else None


# --- the table ----------------------------------------------------------------------------------


def test_table_covers_every_core_optimizer():
    optimizers = {
        "sgd", "nesterov", "adam", "adamw", "nadam", "nadamw", "adamax", "adamaxw", "amsgrad",
        "adabelief", "radam", "adagrad", "adadelta", "adafactor", "rmsprop", "lamb", "lars",
        "lion", "yogi", "adan", "novograd", "fromage", "sign_sgd", "signum", "rprop",
        "noisy_sgd", "polyak_sgd", "optimistic_gradient_descent", "sm3", "optimistic_adam",
        "lbfgs",
    }  # fmt: skip
    assert optimizers <= set(gradtx.__all__)
    assert {row.optimizer for row in TABLE} == optimizers
    for problem in PROBLEMS:  # every problem has a measured row for every optimizer
        measured = {r.optimizer for r in TABLE if isinstance(getattr(r, problem), int)}
        failing = {r.optimizer for r in TABLE if getattr(r, problem) == NO}
        assert measured | failing == optimizers, problem


@pytest.mark.parametrize("row", TABLE, ids=str)
def test_steps_within_budget(row):
    tx = row.make()
    for problem in PROBLEMS:
        expected = getattr(row, problem)
        if expected == SKIP:
            continue
        if expected == NO:
            steps = steps_to_reach(tx, problem, NO_HORIZON)
            assert steps is None, f"{row} now reaches {problem} in {steps} steps: update TABLE"
            continue
        steps = steps_to_reach(tx, problem, budget(expected))
        assert steps is not None, f"{row} did not reach {problem} in {budget(expected)} steps"
        assert steps >= expected / 1.5, (
            f"{row} reaches {problem} in {steps} steps, the table says {expected}: update TABLE"
        )


def test_float32_state_lets_bf16_params_settle():
    """The documented remedy for bf16 params: keep the second moment in float32."""
    assert steps_to_reach(gradtx.nadam(0.01), "bf16", 1500) is None
    steps = steps_to_reach(gradtx.nadam(0.01, nu_dtype=jnp.float32), "bf16", 1500)
    assert steps is not None and steps < 1200, steps


# --- the docs page shows this table ---------------------------------------------------------------


def reference_checked(optimizer: str) -> str:
    """What the contract suite checks the optimizer against (tests/contract/registry/)."""
    entries = [e for e in REGISTRY if e.name == optimizer]
    assert entries, optimizer
    return "NumPy, optax" if any(e.oracle is not None for e in entries) else "NumPy"


def render_table() -> str:
    """The markdown table of docs/numerics.md."""
    lines = [
        "| Optimizer | Arguments | Reference checked | Parabola | Rosenbrock | Parabola, bf16 "
        "| Parabola, complex64 |",
        "|---|---|---|--:|--:|--:|--:|",
    ]
    for row in TABLE:
        cells = [f"`{row.optimizer}`", f"`{row.args}`" if row.args else "defaults"]
        cells.append(reference_checked(row.optimizer))
        cells += [str(getattr(row, problem)) for problem in PROBLEMS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def test_docs_page_shows_this_table():
    text = PAGE.read_text()
    assert render_table() in text, (
        "docs/numerics.md does not show the table of tests/convergence_table.py; paste the "
        "output of `render_table()` into it"
    )
    tolerances = re.findall(r"below (\S+) \(bf16: (\S+)\)", text)
    assert tolerances == [(str(TOL), str(TOL_BF16))]
