"""optax's and Flax's parameter-group patterns, ported unchanged, against optax as the oracle.

- A whole-model mask (a bool tree, or what an optax-style mask function returns) inside one
  group of a `multi_transform`: it names the other groups' paths too.
- A label tree whose labels equal the params' keys (`{"enc": {"w": "enc"}, ...}`), which also
  looks like `{label: selector}`.
- optax's "freezing parameters" recipe: `multi_transform` with `set_to_zero()` for the frozen
  label, labels from `flax.traverse_util.path_aware_map`.
- The Flax NNX optimization cookbook's per-parameter learning rates: `nnx.Optimizer(model, tx,
  wrt=nnx.Param)` with a partition by parameter name.
- `mask_compatible_extra_args`: a per-parameter extra argument of `update` reaches each group
  restricted to its paths.

Each runs 5 steps in gradtx and in optax and compares the params (float32 tolerance).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gradtx
from gradtx.paths import LabelError, SelectorError

STEPS = 5
RTOL, ATOL = 1e-5, 1e-6


def _params() -> dict:
    rng = np.random.default_rng(0)
    shapes = {"enc": {"w": (3, 2), "b": (2,)}, "head": {"w": (2, 2), "b": (2,)}}
    return jax.tree.map(
        lambda s: jnp.asarray(rng.normal(size=s), jnp.float32),
        shapes,
        is_leaf=lambda x: isinstance(x, tuple),
    )


def _grads(params: Any, t: int) -> Any:
    return jax.tree.map(lambda p: jnp.sin(3.0 * p + t) + 0.1 * (t + 1), params)


def _run(tx: Any, params: Any, steps: int = STEPS) -> Any:
    state = tx.init(params)
    for t in range(steps):
        updates, state = tx.update(_grads(params, t), state, params)
        params = optax.apply_updates(params, updates)
    return params


def _run_optax(tx: Any, params: Any, steps: int = STEPS) -> Any:
    with jax.numpy_dtype_promotion("standard"):  # optax mixes int counts and float32
        return _run(tx, params, steps)


def _assert_close(got: Any, want: Any, atol: float = ATOL) -> None:
    got, want = gradtx.paths.leaves(got), gradtx.paths.leaves(want)
    assert list(got) == list(want)
    for path in got:
        np.testing.assert_allclose(got[path], want[path], rtol=RTOL, atol=atol, err_msg=path)


def _assert_moved(before: Any, after: Any, paths: list[str]) -> None:
    for path in paths:
        old, new = gradtx.tree.get(before, path), gradtx.tree.get(after, path)
        assert not np.allclose(old, new), f"{path} did not move"


# --- a whole-model mask inside a group ---------------------------------------------------------

MASK = {"enc": {"w": True, "b": False}, "head": {"w": True, "b": False}}
SLOW_FAST = {"enc": {"w": "slow", "b": "slow"}, "head": {"w": "fast", "b": "fast"}}


def test_a_whole_model_bool_mask_inside_a_group_equals_optax():
    tx = gradtx.partition(
        {"slow": gradtx.adamw(1e-2, weight_decay=0.5, mask=MASK), "fast": gradtx.sgd(1e-2)},
        SLOW_FAST,
    )
    oracle = optax.multi_transform(
        {"slow": optax.adamw(1e-2, weight_decay=0.5, mask=MASK), "fast": optax.sgd(1e-2)},
        SLOW_FAST,
    )
    got = _run(tx, _params())
    _assert_close(got, _run_optax(oracle, _params()))
    # the decay is in the result: without it enc/w lands elsewhere
    no_decay = gradtx.partition(
        {"slow": gradtx.adamw(1e-2, weight_decay=0.0), "fast": gradtx.sgd(1e-2)}, SLOW_FAST
    )
    assert not np.allclose(got["enc"]["w"], _run(no_decay, _params())["enc"]["w"])
    np.testing.assert_array_equal(got["enc"]["b"], _run(no_decay, _params())["enc"]["b"])


def _matrices(params: Any) -> Any:
    return jax.tree.map(lambda x: x.ndim > 1, params)


def test_an_optax_style_mask_function_inside_a_group_equals_optax():
    tx = gradtx.partition(
        {"slow": gradtx.adamw(1e-2, weight_decay=0.5, mask=_matrices), "fast": gradtx.sgd(1e-2)},
        SLOW_FAST,
    )
    oracle = optax.multi_transform(
        {"slow": optax.adamw(1e-2, weight_decay=0.5, mask=_matrices), "fast": optax.sgd(1e-2)},
        SLOW_FAST,
    )
    _assert_close(_run(tx, _params()), _run_optax(oracle, _params()))


def test_a_whole_model_mask_may_select_none_of_its_groups_paths():
    # The biases' group decays nothing under a mask of the matrices: data, not a typo.
    labels = {"enc": {"w": "w", "b": "b"}, "head": {"w": "w", "b": "b"}}
    tx = gradtx.partition(
        {"w": gradtx.sgd(1e-2), "b": gradtx.adamw(1e-2, weight_decay=0.5, mask=MASK)}, labels
    )
    oracle = optax.multi_transform(
        {"w": optax.sgd(1e-2), "b": optax.adamw(1e-2, weight_decay=0.5, mask=MASK)}, labels
    )
    _assert_close(_run(tx, _params()), _run_optax(oracle, _params()))


def test_globs_in_a_group_are_checked_against_the_whole_model():
    # "head/w" matches only the other group's path: fine, the group decays nothing.
    fine = gradtx.partition(
        {"slow": gradtx.adamw(1e-2, weight_decay=0.5, mask="head/w"), "fast": gradtx.sgd(1e-2)},
        SLOW_FAST,
    )
    plain = gradtx.partition(
        {"slow": gradtx.adam(1e-2), "fast": gradtx.sgd(1e-2)},
        SLOW_FAST,
    )
    _assert_close(_run(fine, _params()), _run(plain, _params()))
    # a glob matching nothing in the whole model is still a typo, excluding ones too
    for mask, shown in [("haed/w", "'haed/w' matches no path"), ("!**/bias", "excludes nothing")]:
        typo = gradtx.partition(
            {"slow": gradtx.adamw(1e-2, weight_decay=0.5, mask=mask), "fast": gradtx.sgd(1e-2)},
            SLOW_FAST,
        )
        with pytest.raises(SelectorError, match=shown):
            typo.init(_params())


def test_a_mask_path_not_in_the_params_at_all_is_still_an_error():
    mask = {"enc": {"w": True, "b": False}, "head": {"w": True, "b": False}, "tail": True}
    tx = gradtx.partition(
        {"slow": gradtx.adamw(1e-2, weight_decay=0.5, mask=mask), "fast": gradtx.sgd(1e-2)},
        SLOW_FAST,
    )
    with pytest.raises(SelectorError, match=r"the bool tree has path 'tail', which is not in"):
        tx.init(_params())


# --- labels that equal the params' keys --------------------------------------------------------


def test_a_label_tree_whose_labels_equal_its_keys_equals_optax():
    labels = {"enc": {"w": "enc", "b": "enc"}, "head": {"w": "head", "b": "head"}}
    tx = gradtx.partition({"enc": gradtx.adam(1e-2), "head": gradtx.sgd(1e-2)}, labels)
    oracle = optax.multi_transform({"enc": optax.adam(1e-2), "head": optax.sgd(1e-2)}, labels)
    got = _run(tx, _params())
    _assert_close(got, _run_optax(oracle, _params()))
    assert sorted(gradtx.state_dict(tx.init(_params()))) == [
        "enc/count/enc/b",
        "enc/count/enc/w",
        "enc/mu/enc/b",
        "enc/mu/enc/w",
        "enc/nu/enc/b",
        "enc/nu/enc/w",
    ]


def test_a_dict_read_two_ways_with_different_labels_raises():
    params = {name: {"w": jnp.ones(2)} for name in "abc"}
    transforms = {name: gradtx.sgd(0.1) for name in "abc"}
    # As {label: selector}, label "a" takes "b/**"; as a label tree, "a/**" takes label "b".
    tx = gradtx.partition(transforms, {"a": "b", "b": "c", "c": "a"})
    with pytest.raises(LabelError, match=r"reads two ways.*'a/w' -> 'c'.*'a/w' -> 'b'"):
        tx.init(params)
    # the two fixes the message names
    as_tree = gradtx.partition(transforms, lambda params: {"a": "b", "b": "c", "c": "a"})
    as_globs = gradtx.partition(transforms, {"a": "b/**", "b": "c/**", "c": "a/**"})
    assert gradtx.explain(as_tree, params)["a/w"].steps[0] == "[b]"
    assert gradtx.explain(as_globs, params)["a/w"].steps[0] == "[c]"


# --- optax's "freezing parameters" recipe ------------------------------------------------------

linen = pytest.importorskip("flax.linen", reason="the Flax recipes need flax")
traverse_util = pytest.importorskip("flax.traverse_util")


class MLP(linen.Module):
    @linen.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return linen.Dense(1)(jnp.tanh(linen.Dense(4)(x)))


def _linen_params() -> Any:
    return MLP().init(jax.random.PRNGKey(0), jnp.ones((1, 3)))


def _train_linen(tx: Any) -> Any:
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 3))
    y = jnp.sin(x[:, :1])
    params = _linen_params()
    state = tx.init(params)
    for _ in range(STEPS):
        grads = jax.grad(lambda p: jnp.mean((MLP().apply(p, x) - y) ** 2))(params)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params


def _freeze_labels(params: Any) -> Any:
    """The recipe's labels: every parameter of the first layer is frozen."""
    return traverse_util.path_aware_map(
        lambda path, _: "frozen" if "Dense_0" in path else "trainable", params
    )


@pytest.mark.parametrize(
    "labels",
    [
        _freeze_labels(_linen_params()),  # the label tree, as the recipe builds it
        _freeze_labels,  # the same function, called with the params as optax calls it
        lambda path, leaf: "frozen" if "/Dense_0/" in f"/{path}/" else "trainable",
        {"frozen": "params/Dense_0", "trainable": "params/Dense_1"},
    ],
    ids=["label-tree", "label-function-of-params", "label-function-of-path", "selectors"],
)
def test_the_freezing_recipe_equals_optax(labels):
    tx = gradtx.multi_transform(
        {"trainable": gradtx.adam(5e-2), "frozen": gradtx.set_to_zero()}, labels
    )
    oracle = optax.multi_transform(
        {"trainable": optax.adam(5e-2), "frozen": optax.set_to_zero()}, _freeze_labels
    )
    got = _train_linen(tx)
    with jax.numpy_dtype_promotion("standard"):
        want = _train_linen(oracle)
    # an ulp in a small second moment shows as ~1e-6 in a parameter near 0 after 5 steps
    _assert_close(got, want, atol=1e-5)
    start = _linen_params()
    jax.tree.map(
        np.testing.assert_array_equal, got["params"]["Dense_0"], start["params"]["Dense_0"]
    )
    _assert_moved(start, got, ["params/Dense_1/kernel", "params/Dense_1/bias"])
    # the frozen label keeps no state
    keys = gradtx.state_dict(tx.init(start))
    assert keys and all(k.startswith("trainable/") and "Dense_1" in k for k in keys)


# --- Flax NNX: per-parameter learning rates with nnx.Optimizer ---------------------------------

nnx = pytest.importorskip("flax.nnx", reason="the Flax NNX recipe needs flax")

RATES = {"kernel": 5e-2, "bias": 1e-3}


def _nnx_model() -> Any:
    rngs = nnx.Rngs(0)
    return nnx.Sequential(nnx.Linear(2, 8, rngs=rngs), nnx.Linear(8, 8, rngs=rngs))


def _by_name(params: Any) -> Any:
    """optax's labels: each parameter's own name (`kernel` or `bias`)."""

    def name(key_path: tuple, _: Any) -> str:
        return next(k.key for k in reversed(key_path) if isinstance(k, jax.tree_util.DictKey))

    return jax.tree_util.tree_map_with_path(name, params)


def _train_nnx(tx: Any) -> dict[str, np.ndarray]:
    model = _nnx_model()
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    x = jax.random.normal(jax.random.PRNGKey(2), (32, 2))
    y = jax.random.normal(jax.random.PRNGKey(3), (32, 8))

    @nnx.jit
    def step(model: Any, optimizer: Any) -> None:
        grads = nnx.grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        optimizer.update(model, grads)

    for _ in range(STEPS):
        step(model, optimizer)
    return {p: np.asarray(v) for p, v in gradtx.paths.leaves(nnx.state(model, nnx.Param)).items()}


@pytest.mark.parametrize(
    "labels",
    [
        lambda path, leaf: path.rsplit("/", 1)[-1],
        _by_name,
        {"kernel": "**/kernel", "bias": "**/bias"},
    ],
    ids=["label-function-of-path", "label-function-of-params", "selectors"],
)
def test_nnx_per_parameter_learning_rates_equal_optax(labels):
    tx = gradtx.partition({name: gradtx.adam(lr) for name, lr in RATES.items()}, labels)
    oracle = optax.multi_transform({name: optax.adam(lr) for name, lr in RATES.items()}, _by_name)
    got = _train_nnx(tx)
    with jax.numpy_dtype_promotion("standard"):
        want = _train_nnx(oracle)
    assert list(got) == ["layers/0/bias", "layers/0/kernel", "layers/1/bias", "layers/1/kernel"]
    for path in got:
        np.testing.assert_allclose(got[path], want[path], rtol=RTOL, atol=1e-5, err_msg=path)
    # the rates differ: one rate for all would land elsewhere
    same = _train_nnx(gradtx.adam(RATES["kernel"]))
    assert not np.allclose(got["layers/0/bias"], same["layers/0/bias"])


# --- mask_compatible_extra_args ----------------------------------------------------------------


def _scale_by_factors() -> optax.GradientTransformationExtraArgs:
    """An optax-style step reading a per-parameter extra argument `factors`."""

    def init(params: Any) -> Any:
        return optax.EmptyState()

    def update(updates: Any, state: Any, params: Any = None, *, factors: Any, **extra: Any):
        return jax.tree.map(lambda u, f: u * f, updates, factors), state

    return optax.GradientTransformationExtraArgs(init, update)


def _factors(params: Any) -> Any:
    return jax.tree.map(lambda p: jnp.full_like(p, 3.0), params)


def _step_with_factors(tx: Any, params: Any) -> Any:
    grads = _grads(params, 0)
    return tx.update(grads, tx.init(params), params, factors=_factors(params), loss=1.0)[0]


def test_masked_restricts_compatible_extra_args_as_optax_does():
    tx = gradtx.masked(_scale_by_factors(), "**/w", mask_compatible_extra_args=True)
    mask = {"enc": {"w": True, "b": False}, "head": {"w": True, "b": False}}
    oracle = optax.masked(_scale_by_factors(), mask, mask_compatible_extra_args=True)
    got = _step_with_factors(tx, _params())
    _assert_close(got, _step_with_factors(oracle, _params()))
    np.testing.assert_array_equal(got["enc"]["w"], 3.0 * _grads(_params(), 0)["enc"]["w"])
    np.testing.assert_array_equal(got["enc"]["b"], _grads(_params(), 0)["enc"]["b"])
    # without it, the inner step gets the whole tree, as in optax: its own structure error
    plain = gradtx.masked(_scale_by_factors(), "**/w")
    with pytest.raises(ValueError, match="pytree structure error"):
        _step_with_factors(plain, _params())


def test_partition_restricts_compatible_extra_args_as_optax_does():
    transforms = {"slow": _scale_by_factors(), "fast": gradtx.sgd(1e-2)}
    tx = gradtx.partition(transforms, SLOW_FAST, mask_compatible_extra_args=True)
    oracle = optax.multi_transform(
        {"slow": _scale_by_factors(), "fast": optax.sgd(1e-2)},
        SLOW_FAST,
        mask_compatible_extra_args=True,
    )
    got = _step_with_factors(tx, _params())
    _assert_close(got, _step_with_factors(oracle, _params()))
    np.testing.assert_array_equal(got["enc"]["b"], 3.0 * _grads(_params(), 0)["enc"]["b"])
    plain = gradtx.partition(transforms, SLOW_FAST)
    with pytest.raises(ValueError, match="pytree structure error"):
        _step_with_factors(plain, _params())


# --- optax's freeze(mask) ----------------------------------------------------------------------


def test_optax_style_freeze_of_a_mask_alone_says_what_to_write():
    with pytest.raises(
        TypeError, match=r"got str 'enc'.*`gradtx.freeze\(gradtx.adamw\(1e-3\), 'enc'\)`"
    ):
        gradtx.freeze("enc")
    with pytest.raises(TypeError, match=r"optax's `freeze\(mask\)`.*gradtx.set_to_zero\(\)"):
        gradtx.freeze(MASK)
    with pytest.raises(TypeError, match=r"`where` is missing.*gradtx.freeze\(tx, \"enc/\*\*\"\)"):
        gradtx.freeze(gradtx.adam(0.1))
    with pytest.raises(
        TypeError, match=r"trainable\(inner, where\): `inner` must be the optimizer"
    ):
        gradtx.trainable("head")
    # what the message suggests runs, and equals optax's chain of freeze and the optimizer
    frozen = {"enc": True, "head": False}
    tx = gradtx.freeze(gradtx.sgd(1e-2), frozen)
    oracle = optax.chain(optax.transforms.freeze(frozen), optax.sgd(1e-2))
    got = _run(tx, _params())
    _assert_close(got, _run_optax(oracle, _params()))
    jax.tree.map(np.testing.assert_array_equal, got["enc"], _params()["enc"])
