"""optax-style `(init, update)` pairs inside gradtx combinators."""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from gradtx._core.module import static
from gradtx._core.protocol import Params, State, Transformation, Updates
from gradtx._optax.named_states import factory_name, injected_hyperparams, keyed, plain
from gradtx._paths.subset import present_paths


class ForeignTransform(Transformation):
    """An optax-style `(init, update)` pair run inside gradtx combinators, kept static.

    `chain`, `masked`, `partition` and the other combinators wrap any object with `init` and
    `update` methods (an optax `GradientTransformation`) in this class, named after the optax
    factory that made it (`scale_by_adam`, `chain`, `inject_hyperparams`; see `name`). Its
    numerics are optax's own: `update` calls the wrapped `update` with the updates, state and
    params it is given, and passes `**extra` on only if the wrapped `update` accepts them.

    State keys: optax keeps a chain's states in a tuple; here every such tuple is kept as
    `NamedStates`, whose entries are named after the transformation that made them when it
    can be read (an optax factory's name, or a gradtx transformation's `name`), else after
    their state type (`ScaleByAdamState` gives `scale_by_adam`), else by position. So
    `state_dict` reads `chain/scale_by_adam/mu/w` rather than `chain/0/mu/w`, and
    `load_state_dict`, `reconcile`, `save` and `restore` use those keys. The wrapped
    transformation still receives and returns its own tuples.

    What a wrapped optax transformation does not get, compared with a gradtx one:

    - Path-keyed state. Its state is optax's: moments are pytrees shaped like the params
      (`mu/enc/w` inside it still reads by path, since optax mirrors the params), but there
      are no per-path slots, no packed or bucketed storage, and no `mu_dtype` beyond what the
      optax factory takes.
    - Per-path step counts for partial updates. Its step count (where it keeps one) is one
      scalar for the whole tree, and a `None` gradient at a path where its state holds arrays
      is left to optax, where most transformations fail with a tree-structure error. So two
      models cannot take turns in one wrapped optimizer: give each model its own wrapped
      transformation in a `partition` (a label without gradients keeps its state as it was),
      or use a gradtx transformation. `None` leaves that were `None` at `init` too (the
      fields `eqx.filter_grad` leaves out) are fine.
    - `describe` and `explain` details. `explain` lists it as one step named `name`; the only
      hyperparameters it shows are those of an `optax.inject_hyperparams` state at the top or
      in a chain entry (its `learning_rate`, `b1`, ... at the step asked for), so its learning
      rate column reads `-` otherwise. `gradtx.hyperparams`, `set_hyperparams` and `stats`
      do not read optax's injected hyperparameters.
    - `eval_params`. It returns the params unchanged, so the averaged weights of an optax
      schedule-free or lookahead transformation are not what `gradtx.eval_params` gives; use
      optax's own functions on the wrapped state.
    - `frozen_paths`. It freezes nothing as far as `accumulate` knows, even where its updates
      are zero (`optax.set_to_zero`).

    Attributes:
        inner: the wrapped `(init, update)` object, kept as static structure (the same object
            never recompiles a jitted step).
        label: the name of its state inside a chain.

    Examples:
        >>> import optax
        >>> tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), optax.adam(0.1))  # wrapped
        >>> state = tx.init({"w": jnp.zeros(2)})
        >>> [key for key in gradtx.state_dict(state) if key.startswith("chain/")]
        ['chain/scale_by_adam/count', 'chain/scale_by_adam/mu/w', 'chain/scale_by_adam/nu/w']
        >>> with jax.numpy_dtype_promotion("standard"):  # optax mixes int counts and floats
        ...     updates, state = tx.update({"w": jnp.ones(2)}, state)
        >>> round(float(updates["w"][0]), 4)  # Adam's first step: -learning_rate * sign
        -0.1
    """

    inner: Any = static()
    label: str = static("optax")
    # optax's own per-example transformations (differential privacy) take a batch axis.
    gradients_like_params: ClassVar[bool] = False

    @property
    def name(self) -> str:
        """The key of this step's state inside a chain."""
        return self.label

    def _maker(self) -> tuple[Any, Any]:
        return self.inner.init, self.inner.update

    def init_state(self, params: Params) -> State:
        """The wrapped `init(params)`, its tuples kept as `NamedStates`."""
        return keyed(self.inner.init(params), self._maker())

    def step(
        self, updates: Updates, state: State, params: Params | None = None, **extra: Any
    ) -> tuple[Updates, State]:
        """The wrapped `update` on optax's own state; the new state keyed as `init` keys it.

        `state` may be the keyed state `init` gives or the wrapped transformation's own.
        """
        own = plain(state)
        passed = extra if _takes_extra(self.inner.update) else {}
        updates, own = self.inner.update(updates, own, params, **passed)
        return updates, keyed(own, self._maker())

    def describe(self, params: Params, step: Any = 0) -> dict[str, list[tuple[str, dict]]]:
        """One step, `name`, on every present path, with the optax injected hyperparameters.

        The hyperparameters are those of an `optax.inject_hyperparams` state that is the
        wrapped state or an entry of its chain, at `step` (see `injected_hyperparams`).
        """
        entry = (self.name, injected_hyperparams(self.inner, step))
        return {path: [entry] for path in present_paths(params)}


def _takes_extra(fn: Any) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is p.VAR_KEYWORD for p in parameters)


def as_transformation(tx: Any, argument: str = "transform") -> Transformation:
    """Return `tx` as a gradtx `Transformation`, wrapping optax-style `(init, update)` pairs."""
    if isinstance(tx, Transformation):
        return tx
    if callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None)):
        return ForeignTransform(tx, factory_name(tx.init, tx.update) or "transform")
    raise TypeError(
        f"`{argument}` must be a transformation (an object with init and update), "
        f"got {type(tx).__name__}: {tx!r}"
    )
