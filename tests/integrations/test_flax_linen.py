"""gradtx with Flax Linen: `TrainState`, and the `nn.Partitioned` boxes of sharded params.

`nn.with_partitioning` leaves each annotated parameter in an `nn.Partitioned` box holding the
array and its mesh axis names. The box is path-transparent, as an NNX `Variable` is: the
kernel is `Dense_0/kernel`, not `Dense_0/kernel/value`, so selectors, state keys and `explain`
rows read the same whether a parameter is annotated or not.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gradtx

nn = pytest.importorskip("flax.linen", reason="the Flax Linen integration tests need flax")
train_state = pytest.importorskip("flax.training.train_state")

PATHS = ["Dense_0/bias", "Dense_0/kernel", "Dense_1/bias", "Dense_1/kernel"]


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        split = nn.with_partitioning(nn.initializers.lecun_normal(), (None, "model"))
        x = nn.Dense(8, kernel_init=split)(x)  # annotated: its kernel is boxed
        return nn.Dense(1)(jnp.tanh(x))  # not annotated


def _variables():
    return MLP().init(jax.random.key(0), jnp.ones((1, 3)))


def _train(tx, params, steps=5):
    x = jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(4, 3)
    y = jnp.sum(x, axis=1, keepdims=True)
    state = train_state.TrainState.create(apply_fn=MLP().apply, params=params, tx=tx)

    @jax.jit
    def step(state):
        def loss(p):
            return jnp.mean((state.apply_fn({"params": p}, x) - y) ** 2)

        return state.apply_gradients(grads=jax.grad(loss)(state.params))

    for _ in range(steps):
        state = step(state)
    return state


def _kernels(params):
    """optax's mask: a bool per layer's entry (covering the box below it)."""
    return {name: {"bias": False, "kernel": True} for name in params}


def test_a_partitioned_box_takes_the_path_of_its_parameter() -> None:
    params = _variables()["params"]
    assert isinstance(params["Dense_0"]["kernel"], nn.Partitioned)
    assert gradtx.paths.paths(params) == PATHS
    assert gradtx.paths.paths(params) == gradtx.paths.paths(nn.unbox(params))


def test_train_state_trains_as_with_optax_and_keeps_the_boxes() -> None:
    params = _variables()["params"]
    ours = _train(gradtx.adamw(1e-2, weight_decay=0.1, mask="**/kernel"), params)
    with jax.numpy_dtype_promotion("standard"):  # optax mixes int counts and floats
        theirs = _train(optax.adamw(1e-2, weight_decay=0.1, mask=_kernels), params)
    assert jax.tree.structure(ours.params) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(ours.params), jax.tree.leaves(theirs.params)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert not np.allclose(
        ours.params["Dense_0"]["kernel"].value, params["Dense_0"]["kernel"].value
    )
    state_keys = [k for k in gradtx.state_dict(ours.opt_state) if k.startswith("mu/")]
    assert state_keys == [f"mu/{path}" for path in PATHS]
    rows = gradtx.explain(ours.tx, ours.params)
    decayed = {path: pytest.approx(rows[path].weight_decay) for path in PATHS}
    assert decayed == {path: (0.1 if path.endswith("kernel") else 0.0) for path in PATHS}


def test_the_state_of_a_sharded_kernel_follows_its_annotation() -> None:
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    abstract = jax.eval_shape(MLP().init, jax.random.key(0), jnp.ones((1, 3)))
    shardings = nn.get_sharding(abstract, mesh)
    params = jax.jit(MLP().init, out_shardings=shardings)(jax.random.key(0), jnp.ones((1, 3)))
    promised = gradtx.state_shardings(gradtx.adam(1e-3), params["params"])
    assert promised["mu"]["Dense_0/kernel"].spec == jax.sharding.PartitionSpec(None, "model")
    state = gradtx.adam(1e-3).init(params["params"])
    assert state["mu"]["Dense_0/kernel"].sharding.spec == jax.sharding.PartitionSpec(None, "model")
