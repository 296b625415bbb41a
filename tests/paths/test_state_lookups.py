"""Selectors and `gradtx.tree.get` on the states gradtx builds, by path and by key name."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import gradtx
from gradtx.paths import SelectorError, select


def _params():
    return {"enc": {"w": jnp.ones(2), "b": jnp.ones(2)}, "head": {"w": jnp.ones(3)}}


PATHS = ["enc/b", "enc/w", "head/w"]

# (id, transformation, params made from `_params()`, the prefix of the Adam slots)
STATES = [
    ("adam", lambda: gradtx.adam(0.1), lambda p: p, ""),
    (
        "chain",
        lambda: gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(0.1)),
        lambda p: p,
        "adamw/",
    ),
    ("packed", lambda: gradtx.adam(0.1), gradtx.pack, ""),
    ("bucketed", lambda: gradtx.bucketed(gradtx.adam(0.1)), lambda p: p, ""),
    ("injected", lambda: gradtx.inject_hyperparams(gradtx.adam)(0.1), lambda p: p, "inner/"),
    (
        "masked",
        lambda: gradtx.chain(gradtx.masked(gradtx.adam(0.1), "**", name="all")),
        lambda p: p,
        "all/",
    ),
]


@pytest.mark.parametrize(
    ("make", "params", "prefix"), [c[1:] for c in STATES], ids=[c[0] for c in STATES]
)
def test_selectors_read_every_built_state_by_its_state_dict_keys(make, params, prefix):
    tx = make()
    state = tx.init(params(_params()))
    grads = jax.tree.map(jnp.ones_like, _params())
    _, state = tx.update(params(grads), state, params(_params()))
    keys = set(gradtx.state_dict(state))
    counts = select(state, "**/count")
    if prefix == "inner/":  # inject_hyperparams counts its own steps too
        counts = [p for p in counts if p != "count"]
    assert counts == [f"{prefix}count/{p}" for p in PATHS]
    assert set(counts) <= keys
    moments = select(state, ["**/mu/**", "**/nu/**", "!**/head/**"])
    assert moments == [f"{prefix}{slot}/{p}" for slot in ("mu", "nu") for p in PATHS[:2]]
    assert set(moments) <= keys
    # the paths read back: the step count of every path advanced once
    for path in counts:
        assert int(gradtx.tree.get(state, path)) == 1
    with pytest.raises(SelectorError, match=r"the glob '\*\*/cnt' matches no path"):
        select(state, "**/cnt")


def test_a_step_count_selects_like_a_dict_of_paths():
    state = gradtx.adam(0.1).init(_params())
    assert select(state, "count") == [f"count/{p}" for p in PATHS]
    assert select(state, "count/enc") == ["count/enc/b", "count/enc/w"]
    assert select(state, lambda path, leaf: path.startswith("count/") and leaf.ndim == 0) == [
        f"count/{p}" for p in PATHS
    ]


def test_a_wrapped_optax_state_selects_by_its_field_names():
    state = gradtx.chain(optax.adam(0.1)).init(_params())
    assert select(state, "**/count") == ["chain/scale_by_adam/count"]


# --- tree.get by key name, as optax.tree.get ---------------------------------------------------


def test_get_finds_a_field_nested_in_a_chain_by_its_name():
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(0.1))
    state = tx.init(_params())
    assert gradtx.tree.get(state, "count") is state["adam"]["count"]
    assert gradtx.tree.get(state, "global_norm") is state["clip_by_global_norm"]["global_norm"]
    assert gradtx.tree.get(state, "adam/mu") is state["adam"]["mu"]  # a full path first
    # a name of several keys ends the path key by key: "mu/head/w", not "u/head/w"
    assert gradtx.tree.get(state, "mu/head/w") is state["adam"]["mu"]["head/w"]
    with pytest.raises(KeyError, match="no leaf or subtree at path 'u/head/w'"):
        gradtx.tree.get(state, "u/head/w")


def test_get_by_name_reads_the_paths_inside_a_step_count():
    state = gradtx.chain(gradtx.adam(0.1)).init(_params())
    assert int(gradtx.tree.get(state, "adam/count/enc/w")) == 0
    assert int(gradtx.tree.get(state, "count/enc/w")) == 0
    with pytest.raises(TypeError, match="set the whole of it"):
        gradtx.tree.set(state, "adam/count/enc/w", jnp.int32(3))


def test_set_by_name_replaces_that_one_field():
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(0.1))
    state = tx.init(_params())
    new = gradtx.tree.set(state, "global_norm", jnp.float32(2.0))
    assert float(new["clip_by_global_norm"]["global_norm"]) == 2.0
    assert float(state["clip_by_global_norm"]["global_norm"]) == 0.0
    assert new["adam"] is state["adam"]


def test_get_by_a_name_several_paths_end_in_lists_every_one():
    labels = {f"g{i}": f"layers/{i}" for i in range(8)}
    params = {"layers": [{"w": jnp.ones(1)} for _ in range(8)]}
    tx = gradtx.partition({label: gradtx.adam(0.1) for label in labels}, labels)
    state = tx.init(params)
    with pytest.raises(KeyError, match="8 paths end in it") as error:
        gradtx.tree.get(state, "count")
    message = str(error.value)
    for label in labels:  # every one, not the first few
        assert f"'{label}/count'" in message
    np.testing.assert_array_equal(gradtx.tree.get(state, "g7/count/layers/7/w"), 0)


def test_get_of_an_unknown_name_lists_the_paths():
    state = gradtx.adam(0.1).init(_params())
    with pytest.raises(KeyError, match=r"no leaf or subtree at path 'cnt'.*'count'"):
        gradtx.tree.get(state, "cnt")
