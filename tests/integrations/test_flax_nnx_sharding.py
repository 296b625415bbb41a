"""Flax NNX's `optimizer_sharding` metadata: the state of such a parameter lives where it says.

Flax's guide to sharding the optimizer state apart from the params (data parallelism with a
split state) declares it on the parameter, `nnx.with_metadata(init, optimizer_sharding=P(...))`,
and `nnx.Optimizer` honours it for optax. gradtx's state is keyed by path, not made of the
params' `Variable`s, so gradtx reads the metadata by path: in `init` (eagerly and under
`nnx.jit`), in `state_shardings` and in `slot_layouts`. The mesh runs in a child process with 8
CPU devices; the errors run here on one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from devices import PRELUDE, run_on_8_devices
from jax.sharding import PartitionSpec as P

import gradtx
from gradtx._state.flax_sharding import declared_specs

nnx = pytest.importorskip("flax.nnx", reason="the Flax NNX integration tests need flax")
pure = getattr(nnx, "as_pure", None) or nnx.pure  # `pure` is deprecated in newer Flax

MARKER = "GRADTX-NNX-OPTIMIZER-SHARDING-OK"

MODEL = r"""
import optax
from flax import nnx

pure = getattr(nnx, "as_pure", None) or nnx.pure  # `pure` is deprecated in newer Flax
SPLIT = P("x", "y")  # the state of each kernel: split over the whole 2 x 4 mesh


class MLP(nnx.Module):
    def __init__(self, rngs):
        kernel = nnx.with_metadata(nnx.initializers.lecun_normal(), optimizer_sharding=SPLIT)
        self.l1 = nnx.Linear(16, 32, kernel_init=kernel, rngs=rngs)
        self.l2 = nnx.Linear(32, 8, kernel_init=kernel, rngs=rngs)

    def __call__(self, x):
        return self.l2(jnp.tanh(self.l1(x)))


x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 16)).astype(np.float32))
y = jnp.asarray(np.random.default_rng(1).normal(size=(8, 8)).astype(np.float32))


def flat_specs(opt_state):
    return {k: spec_of(v) for k, v in gradtx.state_dict(pure(opt_state)).items()}


def kernel_state(specs):
    return {k: s for k, s in specs.items() if k.split("/", 1)[0] in ("mu", "nu")}


def param_specs(model):
    return {k: spec_of(v) for k, v in gradtx.state_dict(pure(nnx.state(model, nnx.Param))).items()}


def train(make, tx, reshard=False, keep_layout=False, steps=3):
    model, optimizer = make(tx)
    first = flat_specs(optimizer.opt_state)
    layout = param_specs(model)

    @nnx.jit
    def step(model, optimizer):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    losses = []
    for _ in range(steps):
        losses.append(float(step(model, optimizer)))
        if reshard:  # optax's split updates split the params: back to whole, as Flax does
            model = jax.sharding.reshard(model, P())
        if keep_layout:  # gradtx's updates come out with each parameter's own layout
            assert param_specs(model) == layout, (param_specs(model), layout)
    trained = gradtx.state_dict(pure(nnx.state(model, nnx.Param)))
    params = {k: np.asarray(v) for k, v in trained.items()}
    return first, flat_specs(optimizer.opt_state), losses, params


def eager(tx):
    model = MLP(nnx.Rngs(0))
    return model, nnx.Optimizer(model, tx, wrt=nnx.Param)


def traced(tx):  # the transformation is static to `nnx.Optimizer`: closed over, not traced
    return nnx.jit(lambda: eager(tx))()


for axis_type in (AxisType.Auto, AxisType.Explicit):
    mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(axis_type, axis_type))
    explicit = axis_type == AxisType.Explicit
    with jax.set_mesh(mesh):
        with jax.numpy_dtype_promotion("standard"):  # optax mixes int counts and floats
            reference, _, ref_losses, ref_params = train(eager, optax.adam(1e-2), explicit)
        if explicit:  # without the reshard, optax's step splits the params and then fails
            with jax.numpy_dtype_promotion("standard"):
                model, optimizer = eager(optax.adam(1e-2))
                nnx.jit(lambda m, o: o.update(m, nnx.grad(lambda m: jnp.sum(m(x)))(m)))(
                    model, optimizer
                )
            assert param_specs(model)["l1/kernel"] == ("x", "y"), param_specs(model)
        for make in (eager, traced):
            where = (str(axis_type), make.__name__)
            tx = gradtx.adam(1e-2)
            first, last, losses, params = train(make, tx, keep_layout=explicit)
            # The kernels' moments are split as declared; the biases' follow their parameter.
            for key, spec in kernel_state(first).items():
                assert spec == (("x", "y") if key.endswith("kernel") else ()), (where, key, spec)
            # The same layout as optax's state in Flax's own optimizer, before and after.
            optax_mu = {k.split("mu/", 1)[1]: s for k, s in reference.items() if "/mu/" in k}
            ours_mu = {k[3:]: s for k, s in first.items() if k.startswith("mu/")}
            assert ours_mu == optax_mu, (where, ours_mu, optax_mu)
            for key, spec in kernel_state(last).items():
                if key.endswith("kernel"):
                    assert spec == ("x", "y"), (where, key, spec)
            # The training is the same as with optax.
            np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
            for path, value in params.items():
                np.testing.assert_allclose(value, ref_params[path], rtol=1e-4, atol=1e-6)
            # The promise says the same, for the model and for its abstract twin.
            model, _ = eager(tx)
            for params_like in (
                nnx.state(model, nnx.Param),
                nnx.state(nnx.eval_shape(lambda: MLP(nnx.Rngs(0))), nnx.Param),
            ):
                promised = gradtx.state_dict(gradtx.state_shardings(tx, params_like))
                got = {k: tuple(s.spec) for k, s in promised.items()}
                for key in ("mu/l1/kernel", "nu/l2/kernel"):
                    assert got[key] == ("x", "y"), (where, key, got[key])
            notes = {s.key: s.note for s in gradtx.slot_layouts(tx, nnx.state(model, nnx.Param))}
            assert notes["mu/l1/kernel"] == "as its parameter's optimizer_sharding", notes
            assert notes["mu/l1/bias"] == "as its parameter", notes

# ZeRO-1 on top of a declared layout: `shard_over` splits what is still whole.
mesh = jax.make_mesh((2, 4), ("x", "y"), axis_types=(AxisType.Auto, AxisType.Auto))
with jax.set_mesh(mesh):
    model = MLP(nnx.Rngs(0))
    params = nnx.state(model, nnx.Param)
    promised = gradtx.state_shardings(gradtx.adam(1e-2), params, shard_over="x")
    specs = {k: tuple(s.spec) for k, s in gradtx.state_dict(promised).items()}
    assert specs["mu/l1/kernel"] == ("x", "y"), specs
    assert specs["mu/l1/bias"] == ("x",), specs

# A declared spec that the state's shape does not divide: the error names the parameter.
class Odd(nnx.Module):
    def __init__(self, rngs):
        kernel = nnx.with_metadata(nnx.initializers.lecun_normal(), optimizer_sharding=SPLIT)
        self.l = nnx.Linear(3, 5, kernel_init=kernel, rngs=rngs)


with jax.set_mesh(mesh):
    try:
        nnx.Optimizer(Odd(nnx.Rngs(0)), gradtx.adam(1e-2), wrt=nnx.Param)
    except ValueError as error:
        assert "'l/kernel' declares optimizer_sharding" in str(error), error
        assert "'mu/l/kernel' of shape (3, 5)" in str(error), error
    else:
        raise AssertionError("a (3, 5) kernel split 2 x 4 was accepted")


# ZeRO-1 from gradtx's side, for a model that declares nothing: the optimizer's state is
# moved to the promise of `shard_over="data"` and stays there while it trains.
class Plain(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(16, 32, rngs=rngs)
        self.l2 = nnx.Linear(32, 8, rngs=rngs)

    def __call__(self, x):
        return self.l2(jnp.tanh(self.l1(x)))


def zero1(tx):
    model = Plain(nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)
    shardings = gradtx.state_shardings(tx, nnx.state(model, nnx.Param), shard_over="data")
    moved = jax.device_put(pure(optimizer.opt_state), shardings)
    nnx.update(optimizer.opt_state, nnx.state(moved))
    return model, optimizer


def whole(tx):
    model = Plain(nnx.Rngs(0))
    return model, nnx.Optimizer(model, tx, wrt=nnx.Param)


mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
with jax.set_mesh(mesh):
    first, last, losses, params = train(zero1, gradtx.adam(1e-2), False)
    _, _, ref_losses, ref_params = train(whole, gradtx.adam(1e-2), False)
    for specs in (first, last):
        for key, spec in kernel_state(specs).items():
            assert spec == ("data",), (key, spec)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    for path, value in params.items():
        np.testing.assert_allclose(value, ref_params[path], rtol=1e-4, atol=1e-6)

print("GRADTX-NNX-OPTIMIZER-SHARDING-OK")
"""


@pytest.mark.slow
def test_the_state_lives_where_the_model_declares_and_trains_as_with_optax() -> None:
    run_on_8_devices(PRELUDE + MODEL, MARKER)


def _declaring(value: object) -> object:
    class One(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            init = nnx.with_metadata(nnx.initializers.ones_init(), optimizer_sharding=value)
            self.l = nnx.Linear(2, 4, kernel_init=init, rngs=rngs)

    return One(nnx.Rngs(0))


def test_the_declared_specs_are_read_by_path_in_either_form() -> None:
    assert declared_specs(nnx.state(_declaring(P("x")), nnx.Param)) == {"l/kernel": P("x")}
    names = declared_specs(nnx.state(_declaring(("x", None)), nnx.Param))
    assert names == {"l/kernel": P("x", None)}
    assert declared_specs({"l": {"kernel": jnp.zeros(2)}}) == {}


def test_a_declared_spec_without_a_mesh_is_an_error_naming_the_path() -> None:
    model = _declaring(P("x"))
    with pytest.raises(ValueError, match=r"'l/kernel' declares optimizer_sharding.*set_mesh"):
        nnx.Optimizer(model, gradtx.adam(1e-3), wrt=nnx.Param)


def test_a_declared_spec_of_the_wrong_kind_is_an_error_naming_the_path() -> None:
    model = _declaring("x")
    with pytest.raises(ValueError, match=r"'l/kernel' declares optimizer_sharding='x'"):
        gradtx.adam(1e-3).init(nnx.state(model, nnx.Param))


def test_under_a_mesh_the_declared_slots_are_put_on_it_and_the_others_left_alone() -> None:
    mesh = jax.make_mesh((1,), ("x",), axis_types=(jax.sharding.AxisType.Auto,))
    with jax.set_mesh(mesh):
        model = _declaring(P("x"))
        optimizer = nnx.Optimizer(model, gradtx.adam(1e-3), wrt=nnx.Param)
    state = gradtx.state_dict(pure(optimizer.opt_state))
    for key in ("mu/l/kernel", "nu/l/kernel"):
        assert state[key].sharding == jax.sharding.NamedSharding(mesh, P("x")), key
    bias = nnx.state(model, nnx.Param)["l"]["bias"][...]
    assert state["mu/l/bias"].sharding == bias.sharding  # its parameter's, as without metadata
