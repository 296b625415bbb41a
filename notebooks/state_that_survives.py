# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Optimizer state that survives model edits
#
# The optimizer state is keyed by parameter path, so it survives whatever keeps the paths:
# clipping or projecting the params between steps, rebuilding their containers, adding a
# layer, or restoring a checkpoint into an edited model. This notebook does all four and
# shows Adam's first moment before and after each edit.

# %%
import os
import tempfile

import jax
import jax.numpy as jnp

import gradtx


def mlp(key, sizes):
    keys = jax.random.split(key, len(sizes) - 1)
    return {
        "layers": [
            {"w": 0.5 * jax.random.normal(k, (m, n)), "b": jnp.zeros(n)}
            for k, m, n in zip(keys, sizes[:-1], sizes[1:])
        ]
    }


def loss_fn(params, x, y):
    h = x
    for layer in params["layers"][:-1]:
        h = jnp.tanh(h @ layer["w"] + layer["b"])
    last = params["layers"][-1]
    return jnp.mean((h @ last["w"] + last["b"] - y) ** 2)


x = jax.random.normal(jax.random.key(1), (128, 4))
y = jnp.sin(x.sum(axis=1, keepdims=True))
tx = gradtx.adam(1e-2)
params = mlp(jax.random.key(0), [4, 16, 1])
state = tx.init(params)


def train(params, state, steps=50):
    for _ in range(steps):
        grads = jax.grad(loss_fn)(params, x, y)
        updates, state = tx.update(grads, state, params)
        params = gradtx.apply_updates(params, updates)
    return params, state


def first_moment(state, path="layers/0/w"):
    return gradtx.state_dict(state)[f"mu/{path}"].ravel()[:3]


params, state = train(params, state)
print("mu before any edit:", first_moment(state))

# %% [markdown]
# ## 1. Clipping the params keeps the moments
#
# A projection after the step (here: clip the weights to [-0.3, 0.3]) makes new arrays, but
# the paths are the same, so the next update finds its moments.

# %%
params = jax.tree.map(lambda p: jnp.clip(p, -0.3, 0.3), params)
updates, state_after = tx.update(jax.grad(loss_fn)(params, x, y), state, params)
print("count before:", int(gradtx.state_dict(state)["count/layers/0/w"]))
print("count after: ", int(gradtx.state_dict(state_after)["count/layers/0/w"]))

# %% [markdown]
# ## 2. Rebuilding the containers keeps the moments
#
# The same params as a tuple of layers instead of a list: the paths read the same
# (`layers/0/w`), so the state still fits.

# %%
as_tuple = {"layers": tuple(params["layers"])}
updates, _ = tx.update(jax.grad(loss_fn)(as_tuple, x, y), state, as_tuple)
print(sorted(gradtx.paths.paths(as_tuple)) == sorted(gradtx.paths.paths(params)))

# %% [markdown]
# ## 3. Adding a layer: reconcile keeps what survives
#
# A linear skip connection joins the model. `reconcile` keeps every surviving path's
# moments and counts, and initialises the new ones; the report lists them.


# %%
def loss_with_skip(params, x, y):
    skip = x @ params["skip"]["w"]
    return loss_fn({"layers": params["layers"]}, x, y - skip)


grown = {**params, "skip": {"w": jnp.zeros((4, 1))}}
grown_state, report = gradtx.reconcile(tx, state, grown)
print(report)
print("layers/0/w mu kept:", bool(jnp.all(first_moment(grown_state) == first_moment(state))))
for _ in range(20):
    grads = jax.grad(loss_with_skip)(grown, x, y)
    updates, grown_state = tx.update(grads, grown_state, grown)
    grown = gradtx.apply_updates(grown, updates)
print("skip/w count after 20 steps:", int(gradtx.state_dict(grown_state)["count/skip/w"]))


# %% [markdown]
# ## 4. A checkpoint file restored into an edited model
#
# `save` writes params and state to one safetensors file; `restore` rebuilds them by path.
# The model is then renamed (`layers` becomes `blocks`): `rename` maps the old prefix, and the
# report says what matched.

# %%
folder = tempfile.mkdtemp()
file = os.path.join(folder, "checkpoint.safetensors")
gradtx.save(file, params, state, tx=tx, metadata={"step": 50})
renamed_like = {"blocks": params["layers"]}
restored, restored_state, report = gradtx.restore(
    file, tx, renamed_like, rename={"layers": "blocks"}
)
print("clean:", report.clean, "metadata:", report.metadata)
print("mu restored:", first_moment(restored_state, "blocks/0/w"))
print("mu saved:   ", first_moment(state))
