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
# # Paths, selectors and parameter groups
#
# In gradtx a parameter is named by its **path** in the tree (`encoder/layers/0/kernel`).
# This notebook selects parameters by path, splits them into groups that each get their own
# optimizer, freezes one group, and reads back what the optimizer does to every parameter.
# Synthetic data, a few seconds on a CPU.

# %%
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt

import gradtx

key = jax.random.key(0)
k_embed, k0, k1, k_head = jax.random.split(key, 4)
params = {
    "embed": {"table": 0.1 * jax.random.normal(k_embed, (16, 8))},
    "encoder": {
        "layers": [
            {"kernel": 0.3 * jax.random.normal(k0, (8, 8)), "bias": jnp.zeros(8)},
            {"kernel": 0.3 * jax.random.normal(k1, (8, 8)), "bias": jnp.zeros(8)},
        ],
        "norm": {"scale": jnp.ones(8)},
    },
    "head": {"kernel": 0.3 * jax.random.normal(k_head, (8, 1)), "bias": jnp.zeros(1)},
}
gradtx.paths.paths(params)

# %% [markdown]
# ## Selectors
#
# Globs match whole path segments (`*` within one segment, `**` across several), a leading
# `!` excludes, and a selector that matches nothing is an error rather than a silently
# disabled option.

# %%
print(gradtx.paths.select(params, "**/kernel"))
print(gradtx.paths.select(params, ["encoder/**", "!**/bias"]))
try:
    gradtx.paths.select(params, "**/kernal")
except gradtx.paths.SelectorError as error:
    print("SelectorError:", str(error).splitlines()[0])

# %% [markdown]
# ## Groups with their own optimizers
#
# `partition` gives every trained parameter exactly one label: the encoder trains with AdamW
# (no weight decay on biases and norms), the head with faster SGD. `freeze` keeps the
# embedding as it is, with no optimizer state.

# %%
groups = gradtx.partition(
    {
        "encoder": gradtx.adamw(
            gradtx.schedules.warmup_cosine_decay(0.0, 3e-3, 10, 200),
            weight_decay=1e-2,
            mask=["!**/bias", "!**/scale"],
        ),
        "head": gradtx.sgd(3e-2, momentum=0.9),
    },
    {"encoder": "encoder/**", "head": "head/**"},
)
tx = gradtx.freeze(groups, "embed/**")
print(gradtx.explain(tx, params, step=50))

# %% [markdown]
# ## Training, and the learning rate of each group over time

# %%
x = jax.random.randint(jax.random.key(1), (64,), 0, 16)
y = jnp.sin(x.astype(jnp.float32))[:, None]


def loss_fn(params, x, y):
    h = params["embed"]["table"][x]
    for layer in params["encoder"]["layers"]:
        h = jnp.tanh(h @ layer["kernel"] + layer["bias"])
    h = h * params["encoder"]["norm"]["scale"]
    return jnp.mean((h @ params["head"]["kernel"] + params["head"]["bias"] - y) ** 2)


@jax.jit
def step(params, state):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, state = tx.update(grads, state, params)
    return gradtx.apply_updates(params, updates), state, loss


state = tx.init(params)
embed_before = params["embed"]["table"]
losses = []
for _ in range(200):
    params, state, loss = step(params, state)
    losses.append(float(loss))
print("embedding unchanged:", bool(jnp.all(params["embed"]["table"] == embed_before)))

steps = range(0, 200, 10)
rates = {
    group: [gradtx.explain(tx, params, step=s)[path].learning_rate for s in steps]
    for group, path in [("encoder", "encoder/layers/0/kernel"), ("head", "head/kernel")]
}
fig, (ax_loss, ax_lr) = plt.subplots(1, 2, figsize=(9, 3))
ax_loss.plot(losses)
ax_loss.set(title="loss", xlabel="step", yscale="log")
for group, values in rates.items():
    ax_lr.plot(list(steps), values, label=group)
ax_lr.set(title="learning rate per group", xlabel="step", yscale="log")
ax_lr.legend()
plt.show()

# %% [markdown]
# The optimizer state is keyed by the same paths, group by group:

# %%
sorted(k for k in gradtx.state_dict(state) if k.endswith("layers/0/kernel"))
