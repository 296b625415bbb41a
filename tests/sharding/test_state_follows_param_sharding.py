"""State leaves take the sharding of their parameter (8 CPU devices, in a child process)."""

import pytest
from devices import PRELUDE, run_on_8_devices

# Slow (a subprocess, or a whole run): left out of `make quick` (see CONTRIBUTING.md).
pytestmark = pytest.mark.slow

MARKER = "GRADTX-SHARDING-OK"

SCRIPT = (
    PRELUDE
    + r"""
jax.config.update("jax_numpy_rank_promotion", "raise")


def check_state(state, params, where):
    by_path = gradtx.paths.leaves(params)
    flat = gradtx.state_dict(state)
    assert flat, where
    checked = 0
    for key, leaf in flat.items():
        assert isinstance(leaf.sharding, NamedSharding), (where, key, leaf.sharding)
        if leaf.ndim == 0:  # step counts and statistics: replicated scalars
            assert leaf.sharding.is_fully_replicated, (where, key, leaf.sharding)
            assert spec_of(leaf) == (), (where, key, leaf.sharding.spec)
            continue
        path = max((p for p in by_path if key.endswith("/" + p)), key=len)
        param = by_path[path]
        assert leaf.shape == param.shape, (where, key)
        assert spec_of(leaf) == spec_of(param), (
            f"{where}: {key} has spec {leaf.sharding.spec}, its parameter {path} has "
            f"{param.sharding.spec}"
        )
        assert leaf.sharding.mesh.shape == param.sharding.mesh.shape, (where, key)
        checked += 1
    return checked


def make_params(mesh):
    def put(x, spec):
        return jax.device_put(x, NamedSharding(mesh, spec))

    return {
        "enc": {
            "w": put(jnp.arange(64.0).reshape(16, 4) / 64, P("x")),
            "v": put(jnp.ones((4, 8)), P(None, "x")),
        },
        "head": {"w": put(jnp.linspace(-1.0, 1.0, 32), P("x")), "b": put(jnp.ones(3), P())},
    }


def optimizers():
    return [
        ("adam", gradtx.adam(1e-2)),
        ("adamw", gradtx.adamw(1e-2, weight_decay=0.1, mask="**/w")),
        ("sgd_momentum", gradtx.sgd(0.1, momentum=0.9)),
        (
            "chain",
            gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(1e-2, mu_dtype=jnp.bfloat16)),
        ),
    ]


for axis_type in (AxisType.Auto, AxisType.Explicit):
    mesh = jax.make_mesh((8,), ("x",), axis_types=(axis_type,))
    with jax.set_mesh(mesh):
        params = make_params(mesh)
        for name, tx in optimizers():
            where = f"{axis_type}/{name}"
            init = jax.jit(tx.init)

            @jax.jit
            def step(params, state, tx=tx):
                grads = jax.tree.map(jnp.sin, params)
                updates, state = tx.update(grads, state, params)
                return gradtx.apply_updates(params, updates), state

            state = init(params)
            n = check_state(state, params, where + "/jit(init)")
            assert n >= 4, (where, n)  # at least one slot per parameter
            check_state(tx.init(params), params, where + "/init")
            new_params, new_state = step(params, state)
            new_params, new_state = step(new_params, new_state)
            for path, leaf in gradtx.paths.leaves(new_params).items():
                assert spec_of(leaf) == spec_of(gradtx.paths.leaves(params)[path]), (where, path)
            check_state(new_state, new_params, where + "/jit(update)")
            counts = [v for k, v in gradtx.state_dict(new_state).items() if "count" in k]
            assert all(int(c) == 2 for c in counts), (where, counts)

        # init from abstract params that carry a sharding
        abstract = jax.tree.map(
            lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=p.sharding), params
        )
        check_state(gradtx.adam(1e-2).init(abstract), params, f"{axis_type}/abstract init")

print("GRADTX-SHARDING-OK")
"""
)


def test_state_follows_parameter_sharding_on_8_cpu_devices():
    run_on_8_devices(SCRIPT, MARKER, timeout=300)
