"""Whether a traced step is elementwise: cheap enough to run where it may be thrown away.

A combinator that runs its inner step on some calls only (`accumulate`) can either branch
with `lax.cond` or compute the step every call and select its results. The branch costs
kernels and buffers of its own; the select costs the step itself. For a step that keeps no
per-element state and only does elementwise math (plain SGD, a scale), the select is the
cheaper one: XLA fuses it with the work around it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.extend import core as jex_core

from gradtx._core.protocol import State

# Primitives that act element by element (broadcasts and reshapes of scalars included).
_ELEMENTWISE = frozenset(
    """abs add and atan2 broadcast_in_dim ceil clamp complex conj convert_element_type copy
    copy_p cos div eq erf exp exp2 expand_dims expm1 floor ge gt imag integer_pow is_finite
    le log log1p logistic lt max min mul ne neg nextafter not or pow real reduce_precision
    rem reshape round rsqrt select_n sign sin sqrt square squeeze sub tan tanh xor""".split()
)


def _size(var: Any) -> int:
    return math.prod(getattr(var.aval, "shape", ()))


def _sub_jaxprs(params: dict) -> list[Any]:
    """The jaxprs a call-like equation runs (`jit`, `custom_jvp_call`, ...)."""
    out = []
    for value in params.values():
        if isinstance(value, jex_core.ClosedJaxpr):
            out.append(value.jaxpr)
        elif isinstance(value, jex_core.Jaxpr):
            out.append(value)
    return out


def is_elementwise(jaxpr: Any) -> bool:
    """Whether `jaxpr` does only elementwise work on arrays of more than one element.

    `jaxpr` is a `ClosedJaxpr` or `Jaxpr`; the calls it makes are looked into.

    Scalar work (step counts, schedules, bias corrections) may be anything without effects.
    A reduction, a contraction, a loop, a branch or random bits on an array is not
    elementwise, nor is any primitive this module does not know; a host callback or any
    other effect (printing a scalar, say) makes the step unfit to run on every call.
    """
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        if eqn.effects:
            return False
        # The name is the cheap test: sizing every variable first, with NumPy, dominated the
        # trace of a step over many leaves (benchmarks/compile_time.py).
        if eqn.primitive.name in _ELEMENTWISE:
            continue
        if all(_size(v) <= 1 for v in (*eqn.invars, *eqn.outvars) if hasattr(v, "aval")):
            continue
        inner = _sub_jaxprs(eqn.params)
        if not inner or not all(is_elementwise(j) for j in inner):
            return False
    return True


def keeps_no_arrays(state: State) -> bool:
    """Whether every leaf of `state` holds at most one element (counts, scalars)."""
    return all(np.size(leaf) <= 1 for leaf in jax.tree.leaves(state))


def trace_once(fn: Callable, *args: Any) -> tuple[Any, Any, Callable]:
    """`fn` traced at `args`: its `ClosedJaxpr`, its output shapes, and `fn` replayed.

    The replayed function evaluates the jaxpr on arguments of the same structure, shapes
    and dtypes, giving `fn`'s results without tracing it again. A combinator that looks at
    its inner step (`is_elementwise`), needs its output shapes and then runs it, in a
    `lax.cond` branch or for a check, pays for one trace instead of three or four: tracing
    Adam over many leaves costs far more than replaying its jaxpr (benchmarks/compile_time.py).
    """
    traced, shapes = jax.make_jaxpr(fn, return_shape=True)(*args)
    run_flat = jex_core.jaxpr_as_fun(traced)
    out_tree = jax.tree.structure(shapes)

    def replayed(*new_args: Any) -> Any:
        return jax.tree.unflatten(out_tree, run_flat(*jax.tree.leaves(new_args)))

    return traced, shapes, replayed
