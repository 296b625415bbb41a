"""`state_shardings` and ZeRO-1 on 8 CPU devices (child processes), and its errors in-process."""

import math
from typing import Any

import jax
import jax.numpy as jnp
import pytest
from devices import PRELUDE, run_on_8_devices
from jax.sharding import NamedSharding, PartitionSpec
from jax.sharding import PartitionSpec as P

import gradtx

MARKER = "GRADTX-STATE-SHARDINGS-OK"

HEADER = (
    PRELUDE
    + r"""


def shardings_of(tree):
    return jax.tree.map(lambda x: x.sharding, tree)


def assert_promised(state, promised, where):
    got, expected = jax.tree.leaves(shardings_of(state)), jax.tree.leaves(promised)
    assert len(got) == len(expected), where
    for leaf, a, b in zip(jax.tree.leaves(state), got, expected):
        assert a.is_equivalent_to(b, leaf.ndim), (where, a, b)
"""
)

# One contract-registry entry per public name, under automatic axes of a 2 x 4 mesh: the state is
# created where `state_shardings` says (with and without ZeRO-1), and a jitted step with those
# shardings gives the params of the unsharded step.
REGISTRY = r"""
import registry

mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Auto))
rng = np.random.default_rng(0)


def r(*shape):
    return jnp.asarray(rng.normal(size=shape).astype(np.float32))


# The contract's tree (tests/contract/test_contract.py), with dims the mesh axes divide.
plain = {
    "enc": {"w": r(8, 4), "b": r(4)},
    "layers": [{"w": r(4, 8)}, {"w": r(2), "s": r()}],
    "frozen": None,
}
specs = {
    "enc": {"w": P("model"), "b": P()},
    "layers": [{"w": P(None, "model")}, {"w": P(), "s": P()}],
    "frozen": None,
}
entries = registry.PER_NAME[PART::PARTS]  # this child's share: one entry per public name

# Entries are compiled in batches, one program for a whole batch's states: each program pays
# lowering's and XLA's fixed costs once, so a batch of eight compiles faster than its entries
# one by one (this check's time is mostly compiling).
BATCH = 8


# `check(batch, *args)` for each batch; a batch that fails is run again entry by entry, so
# that the error names its entry.
def per_batch(check, *args):
    for start in range(0, len(entries), BATCH):
        batch = entries[start : start + BATCH]
        try:
            check(batch, *args)
        except Exception:
            for entry in batch:
                check([entry], *args)
            raise


def make_step(tx):
    def step(p, s):
        updates, s = tx.update(jax.tree.map(jnp.cos, p), s, p)
        return gradtx.apply_updates(p, updates), s

    return step


# The params of each entry's unsharded step: what every sharded step below must give.
expected_by_id = {}


def expect(batch):
    txs = [entry.make(entry.scalar) for entry in batch]
    outs = jax.jit(lambda p: [make_step(tx)(p, tx.init(p))[0] for tx in txs])(plain)
    expected_by_id.update(zip([entry.id for entry in batch], outs))


per_batch(expect)


# Each entry's state where promised, with and without ZeRO-1: after `init` under automatic
# axes (`jit` is given the promised shardings, which must fit the state's structure and
# shapes), and under explicit axes after `init` and a jitted step. There the arrays carry
# their shardings and `jit` is told none, so the state's and each update's layouts come from
# the library's math: every parameter must keep its layout and the state its promise, and the
# params must be the unsharded step's. (A step under automatic axes, given these shardings,
# returns them by construction, so it is not run here; ZERO1 below runs one.) Both promises
# (whole and ZeRO-1) are made by one `init` program and stepped by one step program.
OVERS = (None, "data")


def check_batch(batch, params, explicit):
    layouts = [spec_of(x) for x in jax.tree.leaves(params)]
    txs = [entry.make(entry.scalar) for entry in batch]
    wheres = [
        [f"{entry.id}, explicit={explicit}, shard_over={over}" for over in OVERS]
        for entry in batch
    ]
    promised = [
        tuple(gradtx.state_shardings(tx, params, shard_over=o) for o in OVERS) for tx in txs
    ]
    states = jax.jit(
        lambda p: [(tx.init(p),) * len(OVERS) for tx in txs], out_shardings=promised
    )(params)
    for entry_states, entry_promised, entry_wheres in zip(states, promised, wheres):
        for state, promise, where in zip(entry_states, entry_promised, entry_wheres):
            assert_promised(state, promise, where + ", init")
    if not explicit:
        return

    def steps(p, states):
        return [
            tuple(make_step(tx)(p, s) for s in entry_states)
            for tx, entry_states in zip(txs, states)
        ]

    for entry, outs, entry_promised, entry_wheres in zip(
        batch, jax.jit(steps)(params, states), promised, wheres
    ):
        expected = expected_by_id[entry.id]
        for (new_params, new_state), promise, where in zip(outs, entry_promised, entry_wheres):
            assert_promised(new_state, promise, where + ", update")
            assert [spec_of(x) for x in jax.tree.leaves(new_params)] == layouts, where
            for got, want in zip(jax.tree.leaves(new_params), jax.tree.leaves(expected)):
                # Sharded matrix products (muon's Newton-Schulz steps) sum in another order.
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=where)


def placed(mesh):
    return jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), plain, specs)


per_batch(check_batch, placed(mesh), False)
explicit_mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
with jax.set_mesh(explicit_mesh):
    per_batch(check_batch, placed(explicit_mesh), True)

# ZeRO-1 with tensor parallelism: a dim split over "model" takes "data" too where it divides.
bias = {"b": jax.device_put(jnp.ones(1024), NamedSharding(mesh, P("model")))}
for slot in gradtx.slot_layouts(gradtx.adam(1e-3), bias, shard_over="data"):
    if slot.param is not None:
        assert slot.sharding.spec == P(("model", "data")), slot
        assert slot.note == "over 'data' on dim 0, with 'model'", slot
print("entries", len(entries))
"""
# The registry's entries are checked in this many children, which the test workers share.
REGISTRY_PARTS = 3

# ZeRO-1 on a data-parallel mesh: per-device state bytes, the step's collectives, explain.
ZERO1 = r"""
import re

mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
replicated = NamedSharding(mesh, P())
plain = {"w1": jnp.ones((64, 32)), "b1": jnp.ones(32), "w2": jnp.ones((32, 16)), "odd": jnp.ones(3)}
params = jax.device_put(plain, replicated)
tx = gradtx.adamw(1e-3, weight_decay=0.1)


def step(p, s, g):
    updates, s = tx.update(g, s, p)
    return gradtx.apply_updates(p, updates), s


def run(shard_over):
    promised = gradtx.state_shardings(tx, params, shard_over=shard_over)
    state = jax.jit(tx.init, out_shardings=promised)(params)
    shardings = (shardings_of(params), promised)
    jitted = jax.jit(step, in_shardings=(*shardings, shardings[0]), out_shardings=shardings)
    text = jitted.lower(params, state, params).compile().as_text()
    collectives = {
        op: len(re.findall(rf"\b{op}(?:-start)?\(", text))
        for op in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
    }
    per_device = sum(x.addressable_shards[0].data.nbytes for x in jax.tree.leaves(state))
    new_params, new_state = jitted(params, state, jax.tree.map(jnp.sin, params))
    assert_promised(new_state, promised, f"shard_over={shard_over}")
    return new_params, per_device, collectives


whole, whole_bytes, whole_collectives = run(None)
split, split_bytes, split_collectives = run("data")
print("state bytes per device", whole_bytes, split_bytes, split_bytes / whole_bytes)
print("collectives", whole_collectives, split_collectives)
# Replicated params and gradients: the plain step needs no collective at all; ZeRO-1 only
# gathers the updated slices (no all-reduce, no all-to-all).
assert sum(whole_collectives.values()) == 0, whole_collectives
assert split_collectives["all-gather"] >= 1, split_collectives
assert split_collectives["all-reduce"] == split_collectives["all-to-all"] == 0, split_collectives
# About an eighth: only the 3-element `odd` slots and the scalars stay whole.
assert split_bytes / whole_bytes < 0.14, (split_bytes, whole_bytes)
for a, b in zip(jax.tree.leaves(split), jax.tree.leaves(whole)):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
notes = {s.key: s.note for s in gradtx.slot_layouts(tx, params, shard_over="data")}
assert notes["mu/w1"] == "over 'data' on dim 0", notes
assert notes["nu/odd"] == "as its parameter: no dimension divisible by 8", notes
table = gradtx.explain(tx, params, shard_over="data")
assert table["odd"].state_layout == "as its parameter: no dimension divisible by 8"
assert table["w2"].state_layout == "over 'data' on dim 0"
assert "state layout" in str(table)

# Under explicit axes the same ZeRO-1 step needs no shardings given to `jit`: arrays carry
# them in their types, and each update comes out with its parameter's (the all-gather), so
# the params stay whole and the state stays split.
explicit = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
with jax.set_mesh(explicit):
    eparams = jax.device_put(plain, NamedSharding(explicit, P()))
    promised = gradtx.state_shardings(tx, eparams, shard_over="data")
    estate = jax.jit(tx.init, out_shardings=promised)(eparams)
    estep = jax.jit(step)
    text = estep.lower(eparams, estate, eparams).compile().as_text()
    assert re.search(r"\ball-gather(?:-start)?\(", text), "no all-gather"
    new_params, new_state = estep(eparams, estate, jax.tree.map(jnp.sin, eparams))
    assert all(spec_of(x) == () for x in jax.tree.leaves(new_params)), new_params
    assert_promised(new_state, promised, "explicit axes")
    for a, b in zip(jax.tree.leaves(new_params), jax.tree.leaves(split)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)

# A checkpoint of ZeRO-1 state comes back split as promised.
import os, tempfile

promised = gradtx.state_shardings(tx, params, shard_over="data")
state = jax.jit(tx.init, out_shardings=promised)(params)
with tempfile.TemporaryDirectory() as folder:
    file = os.path.join(folder, "ckpt.safetensors")
    gradtx.save(file, params, state, tx=tx)
    _, restored, report = gradtx.restore(file, tx, params, shard_over="data")
assert report.clean, report
assert_promised(restored, promised, "restore")

# bucketed keeps a sharded leaf apart; the promise sees the layout its eager init makes.
bucketed = gradtx.bucketed(gradtx.adam(1e-3))
mixed = {
    "w": jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P("data"))),
    "b": jax.device_put(jnp.ones(8), replicated),
    "c": jax.device_put(jnp.ones(4), replicated),
}
promised = gradtx.state_shardings(bucketed, mixed)
with jax.set_mesh(mesh):  # new scalars (counts, offsets) replicated on the mesh
    eager = bucketed.init(mixed)
assert jax.tree.structure(promised) == jax.tree.structure(eager)
assert_promised(eager, promised, "bucketed")

# FSDP: a parameter already split over the axis keeps its layout; another dim is not added.
fsdp = {"w": jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P("data")))}
(slot,) = [s for s in gradtx.slot_layouts(gradtx.sgd(0.1, momentum=0.9), fsdp, shard_over="data")]
assert slot.note == "as its parameter: already over 'data'", slot
assert slot.sharding.spec == P("data"), slot
"""


def _run_child(body: str) -> str:
    return run_on_8_devices(HEADER + body + f"\nprint({MARKER!r})\n", MARKER)


@pytest.mark.slow
@pytest.mark.parametrize("part", range(REGISTRY_PARTS))
def test_each_public_name_gets_the_promised_shardings_on_8_devices(part):
    out = _run_child(f"PART, PARTS = {part}, {REGISTRY_PARTS}\n" + REGISTRY)
    assert "entries" in out


@pytest.mark.slow
def test_zero1_splits_the_state_an_eighth_per_device_and_only_gathers():
    out = _run_child(ZERO1)
    assert "state bytes per device" in out


def _on_one_device(shape: tuple[int, ...]) -> jax.ShapeDtypeStruct:
    mesh = jax.make_mesh((1,), ("data",))
    return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))


def test_scalars_are_replicated_and_slots_follow_their_parameter():
    params = {"w": _on_one_device((4, 2)), "b": _on_one_device((2,))}
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(1e-3))
    promised = gradtx.state_shardings(tx, params)
    assert promised["adam"]["mu"]["w"] is params["w"].sharding
    norm = promised["clip_by_global_norm"]["global_norm"]
    assert norm.is_fully_replicated and norm.spec == PartitionSpec()


def test_a_parameter_without_a_sharding_is_named():
    params = {"enc": {"w": jax.ShapeDtypeStruct((2, 2), jnp.float32)}}
    with pytest.raises(ValueError, match="'enc/w'.*has no sharding"):
        gradtx.state_shardings(gradtx.adam(1e-3), params)


def test_an_unknown_mesh_axis_is_named_with_the_mesh_axes():
    params = {"w": _on_one_device((4,))}
    with pytest.raises(ValueError, match=r"shard_over='batch'.*\['data'\]"):
        gradtx.state_shardings(gradtx.adam(1e-3), params, shard_over="batch")


def test_a_stack_of_slots_keeps_its_parameter_sharding_behind_the_stack_dim():
    """L-BFGS's memories, `[memory_size, *shape]`: the parameter's split on the last dims;
    ZeRO-1 splits a parameter dim, not the stack of past steps."""
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    split = NamedSharding(mesh, PartitionSpec("model", None))
    params = {"w": jax.ShapeDtypeStruct((6, 4), jnp.float32, sharding=split)}
    tx = gradtx.lbfgs(memory_size=4)
    memories = ("diff_params_memory/w", "diff_updates_memory/w")
    slots = {s.key: s for s in gradtx.slot_layouts(tx, params)}
    for key in memories:
        assert slots[key].sharding.spec == PartitionSpec(None, "model"), slots[key]
        assert slots[key].note == "its parameter's, stacked on dim 0"
    zero1 = {s.key: s for s in gradtx.slot_layouts(tx, params, shard_over="data")}
    for key in memories:
        assert zero1[key].sharding.spec == PartitionSpec(None, "model", "data"), zero1[key]
        assert zero1[key].note == "over 'data' on dim 2"
    assert zero1["weights_memory"].note == "replicated"


def test_a_factored_slot_keeps_the_dims_of_its_parameter():
    mesh = jax.make_mesh((1, 1), ("data", "model"))
    split = NamedSharding(mesh, PartitionSpec("model", None))
    params = {"w": jax.ShapeDtypeStruct((6, 4), jnp.float32, sharding=split)}
    slots = {s.key: s for s in gradtx.slot_layouts(gradtx.adafactor(1e-3), params)}
    factored = [s for s in slots.values() if s.param == "w" and s.sharding.spec != split.spec]
    for slot in factored:
        assert slot.note == "its parameter's, on the dims it keeps", slot


def test_every_registry_entry_gets_a_promise_shaped_like_its_state():
    """All entries, every option (the 8-device check above runs one per public name): the
    promise has the state's structure, and each sharding fits its leaf's rank, with ZeRO-1
    over a mesh axis and a parameter dim split over another."""
    import registry

    mesh = jax.make_mesh((1, 1), ("data", "model"))

    def on(spec, *shape):
        sharding = NamedSharding(mesh, PartitionSpec(*spec))
        return jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)

    params = {
        "enc": {"w": on(("model",), 8, 4), "b": on((), 4)},
        "layers": [{"w": on((None, "model"), 4, 8)}, {"w": on((), 2), "s": on(())}],
        "frozen": None,
    }
    for entry in registry.REGISTRY:
        tx = entry.make(entry.scalar)
        state = jax.eval_shape(tx.init, params)
        promised = gradtx.state_shardings(tx, params, shard_over="data")
        assert jax.tree.structure(promised) == jax.tree.structure(state), entry.id
        for leaf, sharding in zip(jax.tree.leaves(state), jax.tree.leaves(promised)):
            assert sharding.mesh == mesh, entry.id
            assert sharding.shard_shape(leaf.shape) == leaf.shape, (entry.id, sharding)


# --- ZeRO-1 on shapes the axis size does not divide ---------------------------------------------

# Shapes where some or none of the dims divide by 8, the note ZeRO-1 gives their slots over an
# 8-wide axis, and the spec. A dim is split only where the axis size divides it.
UNEVEN = {
    "a": ((12, 16), "over 'data' on dim 1", P(None, "data")),
    "b": ((6, 40), "over 'data' on dim 1", P(None, "data")),
    "c": ((40, 6), "over 'data' on dim 0", P("data")),
    "d": ((4, 16), "over 'data' on dim 1", P(None, "data")),
    "e": ((10, 12), "as its parameter: no dimension divisible by 8", P()),
    "f": ((3, 5, 7), "as its parameter: no dimension divisible by 8", P()),
    "g": ((12, 20, 24), "over 'data' on dim 2", P(None, None, "data")),
}


def _abstract_mesh(*axes: tuple[str, int]) -> jax.sharding.AbstractMesh:
    """A mesh of any size without its devices: the layouts depend only on the axis sizes."""
    sizes, names = tuple(n for _, n in axes), tuple(a for a, _ in axes)
    return jax.sharding.AbstractMesh(sizes, names)


def _assert_divides(slots: list, params: dict, mesh: Any) -> None:
    """Every split dim of every slot is a multiple of the product of its axes' sizes."""
    for slot in slots:
        if slot.param is None:
            continue
        shape = params[slot.param].shape
        if slot.key.startswith(("diff_params_memory", "diff_updates_memory")):
            shape = (8, *shape)
        for dim, entry in enumerate(slot.sharding.spec):
            if entry is None:
                continue
            axes = entry if isinstance(entry, tuple) else (entry,)
            parts = math.prod(mesh.shape[a] for a in axes)
            assert shape[dim] % parts == 0, (slot.key, shape, slot.sharding.spec)


def test_zero1_splits_only_a_dimension_the_axis_size_divides():
    mesh = _abstract_mesh(("data", 8))
    replicated = NamedSharding(mesh, PartitionSpec())
    params = {
        k: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=replicated)
        for k, (shape, _, _) in UNEVEN.items()
    }
    slots = gradtx.slot_layouts(gradtx.adam(1e-3), params, shard_over="data")
    for key in ("mu", "nu"):
        for name, (shape, note, spec) in UNEVEN.items():
            (slot,) = [s for s in slots if s.key == f"{key}/{name}"]
            assert (slot.note, slot.sharding.spec) == (note, spec), (name, shape, slot)
    _assert_divides(slots, params, mesh)


def test_zero1_splits_a_stack_of_slots_on_a_parameter_dim_the_axis_size_divides():
    """L-BFGS's memories `[8, *shape]`: never the stack dim (which 8 divides), and only a
    parameter dim that divides."""
    mesh = _abstract_mesh(("data", 8))
    replicated = NamedSharding(mesh, PartitionSpec())
    params = {
        k: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=replicated)
        for k, (shape, _, _) in UNEVEN.items()
    }
    slots = gradtx.slot_layouts(gradtx.lbfgs(memory_size=8), params, shard_over="data")
    for name, (shape, note, spec) in UNEVEN.items():
        (slot,) = [s for s in slots if s.key == f"diff_params_memory/{name}"]
        dims = [i for i, entry in enumerate(spec) if entry is not None]
        want_note = f"over 'data' on dim {dims[0] + 1}" if dims else note
        want_spec = PartitionSpec(None, *spec) if dims else PartitionSpec()
        assert (slot.note, slot.sharding.spec) == (want_note, want_spec), (name, shape, slot)
    _assert_divides(slots, params, mesh)


def test_zero1_joins_a_split_dimension_only_where_both_axes_divide_it():
    """A 4-wide data axis beside a 2-wide model axis: a free dim that 4 divides first, else
    a dim split over "model" that 8 divides, else none."""
    mesh = _abstract_mesh(("data", 4), ("model", 2))
    cases = {
        "free": ((6, 12), PartitionSpec("model"), PartitionSpec("model", "data")),
        "joined": ((16, 10), PartitionSpec("model"), PartitionSpec(("model", "data"))),
        "neither": ((12, 10), PartitionSpec("model"), PartitionSpec("model")),
        "uneven_free": ((8, 6), PartitionSpec(None, "model"), PartitionSpec("data", "model")),
    }
    params = {
        k: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))
        for k, (shape, spec, _) in cases.items()
    }
    slots = {s.key: s for s in gradtx.slot_layouts(gradtx.adam(1e-3), params, shard_over="data")}
    for name, (shape, _, want) in cases.items():
        assert slots[f"mu/{name}"].sharding.spec == want, (name, shape, slots[f"mu/{name}"])
    _assert_divides(list(slots.values()), params, mesh)


# ZeRO-1 on 8 devices with shapes the axis size divides in some dims, or none: the state is
# created where promised, each device holds an even slice of every split slot, and the
# sharded step gives the unsharded step's params and state.
ZERO1_UNEVEN = r"""
mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))
replicated = NamedSharding(mesh, P())
shapes = {"a": (12, 16), "b": (6, 40), "c": (10, 12), "d": (3, 5, 7), "e": (4, 16)}
rng = np.random.default_rng(0)
plain = {k: jnp.asarray(rng.normal(size=s), jnp.float32) for k, s in shapes.items()}
params = jax.device_put(plain, replicated)
grads = jax.tree.map(jnp.sin, params)
split_dim = {"a": 1, "b": 1, "c": None, "d": None, "e": 1}

for tx in (gradtx.adamw(1e-3, weight_decay=0.1), gradtx.lbfgs(memory_size=4, linesearch=None)):
    promised = gradtx.state_shardings(tx, params, shard_over="data")
    state = jax.jit(tx.init, out_shardings=promised)(params)
    assert_promised(state, promised, "init")
    stacked = ("diff_params_memory", "diff_updates_memory")
    for key, x in gradtx.state_dict(state).items():
        name = key.rsplit("/", 1)[-1]
        if name not in shapes or x.ndim == 0:
            continue
        offset = 1 if key.startswith(stacked) else 0
        dim = split_dim[name]
        want = list(x.shape)
        if dim is not None:  # every slot with a value per element of its parameter
            want[dim + offset] //= 8
        for shard in x.addressable_shards:
            assert list(shard.data.shape) == want, (key, x.shape, shard.data.shape, want)

    def step(p, s, g):
        updates, s = tx.update(g, s, p)
        return gradtx.apply_updates(p, updates), s

    shardings = (shardings_of(params), promised)
    jitted = jax.jit(step, in_shardings=(*shardings, shardings[0]), out_shardings=shardings)
    p1, s1 = params, state
    p0, s0 = plain, tx.init(plain)
    for _ in range(3):
        p1, s1 = jitted(p1, s1, grads)
        p0, s0 = jax.jit(step)(p0, s0, jax.tree.map(jnp.sin, plain))
    assert_promised(s1, promised, "after steps")
    for a, b in zip(jax.tree.leaves((p1, s1)), jax.tree.leaves((p0, s0))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
"""


@pytest.mark.slow
def test_zero1_on_8_devices_splits_uneven_shapes_evenly_or_not_at_all():
    _run_child(ZERO1_UNEVEN)
