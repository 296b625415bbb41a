"""Registry entries of the wrappers around an inner transformation: `accumulate`,
`multi_steps` (with optax's options: a scheduled k and a skip predicate), `apply_every`,
`apply_if_finite`, `lookahead`, `conditionally_transform`, `conditionally_mask` and contrib's
`split_real_and_imaginary`.
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import optax
import optax.contrib
import references as ref
import references.wrappers as rw

import gradtx
from gradtx import contrib, schedules
from registry.entry import LR_SWEEP, Entry, _f


# Conditions are module-level functions: a plain function is static structure, so the same
# object must be passed each time for an equal transformation to reuse its compiled step.
def after_two_steps(step: Any) -> Any:
    """True from the third call on (`step` counts the calls before this one)."""
    return step >= 2


def skip_every_fourth(step: Any) -> Any:
    """False at calls 4, 8, 12, ... (steps 3, 7, 11, ...)."""
    return step % 4 != 3


def _optax_adam(lr: Any) -> Any:
    return optax.adam(_f(lr), b1=_f(0.9), b2=_f(0.999), eps=_f(1e-8))


def _apply_if_finite_adam(entry_id: str, check_updates: bool) -> Entry:
    """`apply_if_finite` around Adam, skipping up to 3 non-finite steps in a row."""
    return Entry(
        id=entry_id,
        name="apply_if_finite",
        make=lambda lr: gradtx.apply_if_finite(gradtx.adam(lr), 3, check_updates),
        reference=lambda lr: rw.apply_if_finite(ref.adam(lr), 3),
        oracle=lambda lr: optax.apply_if_finite(_optax_adam(lr), 3),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.apply_if_finite(
            gradtx.adam(lr, mu_dtype=dt, nu_dtype=dt), 3, check_updates
        ),
    )


def _every_k() -> Any:
    """3 calls for the first optimizer step (so the third call of the contract's tests is an
    optimizer step), 2 afterwards; a schedule, so its numbers are leaves of the pytree."""
    return schedules.piecewise_constant(3.0, {1: 2.0 / 3.0})


def _optax_every_k(step: Any) -> Any:
    return jnp.where(step < 1, 3, 2)


ENTRIES: tuple[Entry, ...] = (
    Entry(
        # every=3, so that the third step of the recompilation test is an optimizer step.
        # "param": state in the params' dtype, as the contract's bf16 test expects by default.
        id="accumulate-sgd",
        name="accumulate",
        make=lambda lr: gradtx.accumulate(gradtx.sgd(lr), every=3, accumulator_dtype="param"),
        reference=lambda lr: rw.accumulate(ref.sgd(lr), 3),
        oracle=lambda lr: optax.MultiSteps(optax.sgd(_f(lr)), 3).gradient_transformation(),
        scalar=0.1,
        sweep=LR_SWEEP,
        converges=True,
        # The accumulators are not read by the updates, which have the inner step's dtype:
        # a float32 momentum makes them float32.
        with_state_dtype=lambda lr, dt: gradtx.accumulate(
            gradtx.sgd(lr, momentum=0.9, accumulator_dtype=dt), every=3, accumulator_dtype=dt
        ),
    ),
    Entry(
        id="multi_steps-sgd-momentum",
        name="multi_steps",
        make=lambda lr: gradtx.multi_steps(
            gradtx.sgd(lr, momentum=0.9), every=3, accumulator_dtype="param"
        ),
        reference=lambda lr: rw.accumulate(ref.sgd(lr, momentum=0.9), 3),
        oracle=lambda lr: optax.MultiSteps(
            optax.sgd(_f(lr), momentum=_f(0.9)), 3
        ).gradient_transformation(),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        # optax keeps a running mean of the micro-steps' gradients, gradtx their sum divided
        # once: the two means round an ulp or two apart.
        oracle_rtol=3e-6,
        with_state_dtype=lambda lr, dt: gradtx.multi_steps(
            gradtx.sgd(lr, momentum=0.9, accumulator_dtype=dt), every=3, accumulator_dtype=dt
        ),
    ),
    _apply_if_finite_adam("apply_if_finite-adam", check_updates=True),
    # Only the gradients are checked, as optax checks them: the inner step runs in a
    # `lax.cond` (the same updates wherever the gradients are finite).
    _apply_if_finite_adam("apply_if_finite-adam-gradients", check_updates=False),
    # optax's lookahead, through `OptaxLookahead`, is the oracle in
    # tests/combinators/test_lookahead.py, on the params: its synchronisation step,
    # `u - (1 - alpha) (theta + u - phi)` in float32, carries the rounding error of the weights
    # theta and phi (about 1e-7 for weights near 1) into the update, more than this suite's 1e-6
    # of the update's own size.
    Entry(
        id="lookahead-sgd",
        name="lookahead",
        make=lambda alpha: gradtx.lookahead(gradtx.sgd(0.1), 3, alpha),
        reference=lambda alpha: rw.lookahead(ref.sgd(0.1), 3, alpha),
        oracle=None,
        scalar=0.5,
        sweep=(0.3, 0.5, 0.8),
        converges=True,
        with_state_dtype=lambda alpha, dt: gradtx.lookahead(
            gradtx.sgd(0.1), 3, alpha, accumulator_dtype=dt
        ),
    ),
    Entry(
        id="lookahead-sgd-momentum",
        name="lookahead",
        make=lambda lr: gradtx.lookahead(gradtx.sgd(lr, momentum=0.9), 2, 0.5),
        reference=lambda lr: rw.lookahead(ref.sgd(lr, momentum=0.9), 2, 0.5),
        oracle=None,
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.lookahead(
            gradtx.sgd(lr, momentum=0.9, accumulator_dtype=dt), 2, 0.5, accumulator_dtype=dt
        ),
    ),
    Entry(
        id="conditionally_transform-sgd-momentum",
        name="conditionally_transform",
        make=lambda lr: gradtx.conditionally_transform(
            gradtx.sgd(lr, momentum=0.9), after_two_steps
        ),
        reference=lambda lr: rw.conditionally_transform(ref.sgd(lr, momentum=0.9), after_two_steps),
        oracle=lambda lr: optax.conditionally_transform(
            optax.sgd(_f(lr), momentum=_f(0.9)), after_two_steps
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.conditionally_transform(
            gradtx.sgd(lr, momentum=0.9, accumulator_dtype=dt), after_two_steps
        ),
    ),
    Entry(
        id="conditionally_mask-adam",
        name="conditionally_mask",
        make=lambda lr: gradtx.conditionally_mask(gradtx.adam(lr), skip_every_fourth),
        reference=lambda lr: rw.conditionally_mask(ref.adam(lr), skip_every_fourth),
        oracle=lambda lr: optax.conditionally_mask(_optax_adam(lr), skip_every_fourth),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        with_state_dtype=lambda lr, dt: gradtx.conditionally_mask(
            gradtx.adam(lr, mu_dtype=dt, nu_dtype=dt), skip_every_fourth
        ),
    ),
    Entry(
        # On real params the split changes nothing: complex params are checked against optax
        # and against gradtx's own pairs of reals in
        # tests/contrib/test_sophia_galore_dpsgd_and_complex_split.py.
        id="contrib.split_real_and_imaginary-adam",
        name="contrib.split_real_and_imaginary",
        make=lambda lr: contrib.split_real_and_imaginary(gradtx.adam(lr)),
        reference=lambda lr: ref.adam(lr),
        oracle=lambda lr: optax.contrib.split_real_and_imaginary(
            optax.adam(_f(lr), b1=_f(0.9), b2=_f(0.999), eps=_f(1e-8))
        ),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
    ),
    Entry(
        # k = n + 1 (an int32 leaf, so a new k reuses the compiled step): every scalar the
        # suites pass, 0.1 included (tests/layouts/test_step_counts.py), gives a valid k.
        id="apply_every",
        name="apply_every",
        make=lambda n: gradtx.apply_every(n + 1),
        reference=lambda n: rw.apply_every(int(n) + 1),
        oracle=lambda n: optax.apply_every(int(n) + 1),
        scalar=2.0,
        sweep=(1.0, 2.0, 3.0),
        converges=False,
    ),
    Entry(
        # "param": accumulators in the params' dtype, as the contract's bf16 test expects.
        id="multi_steps-schedule-skip",
        name="multi_steps",
        make=lambda lr: gradtx.multi_steps(
            gradtx.sgd(lr, momentum=0.9),
            every_k_schedule=_every_k(),
            should_skip_update_fn=gradtx.skip_not_finite,
            accumulator_dtype="param",
        ),
        reference=lambda lr: rw.multi_steps(
            ref.sgd(lr, momentum=0.9), lambda t: 3 if t < 1 else 2, rw.any_not_finite
        ),
        oracle=lambda lr: optax.MultiSteps(
            optax.sgd(_f(lr), momentum=_f(0.9)),
            every_k_schedule=_optax_every_k,
            should_skip_update_fn=optax.skip_not_finite,
        ).gradient_transformation(),
        scalar=0.05,
        sweep=LR_SWEEP,
        converges=True,
        # optax keeps a running mean of the micro-steps' gradients, gradtx their sum divided
        # once: the two means round an ulp or two apart.
        oracle_rtol=3e-6,
        with_state_dtype=lambda lr, dt: gradtx.multi_steps(
            gradtx.sgd(lr, momentum=0.9, accumulator_dtype=dt),
            every_k_schedule=_every_k(),
            should_skip_update_fn=gradtx.skip_not_finite,
            accumulator_dtype=dt,
        ),
    ),
)
