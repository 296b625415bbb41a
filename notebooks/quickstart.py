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
# # gradtx quickstart
#
# This notebook trains a small MLP on a synthetic spiral with a gradtx optimizer, then looks at
# what makes gradtx different: every parameter is named by its **path** in the tree, selectors
# pick parameters by path, and the optimizer state is keyed by the same paths.
#
# Everything here is pure JAX on synthetic data and runs in a few seconds on a CPU.

# %%
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import gradtx

# %% [markdown]
# ## Data and model
#
# Three spiral arms in the plane, and an MLP whose parameters are plain nested dicts:
# `{"layers": [{"kernel": ..., "bias": ...}, ...]}`.

# %%
NUM_CLASSES = 3


def make_spiral(key, per_class=150, noise=0.06):
    k_radius, k_noise = jax.random.split(key)
    n = per_class * NUM_CLASSES
    labels = jnp.repeat(jnp.arange(NUM_CLASSES, dtype=jnp.int32), per_class)
    radius = jax.random.uniform(k_radius, (n,), minval=0.05, maxval=1.0)
    angle = labels.astype(jnp.float32) * (2 * jnp.pi / NUM_CLASSES) + 5.0 * radius
    points = jnp.stack([radius * jnp.cos(angle), radius * jnp.sin(angle)], axis=1)
    return points + noise * jax.random.normal(k_noise, (n, 2)), labels


def init_mlp(key, sizes):
    layers = []
    for k, d_in, d_out in zip(jax.random.split(key, len(sizes) - 1), sizes[:-1], sizes[1:]):
        kernel = jax.random.normal(k, (d_in, d_out)) / jnp.sqrt(jnp.float32(d_in))
        layers.append({"kernel": kernel, "bias": jnp.zeros((d_out,))})
    return {"layers": layers}


def mlp(params, x):
    *hidden, last = params["layers"]
    for layer in hidden:
        x = jnp.tanh(x @ layer["kernel"] + layer["bias"])
    return x @ last["kernel"] + last["bias"]


def loss_fn(params, x, y):
    log_probs = jax.nn.log_softmax(mlp(params, x))
    return -jnp.mean(jnp.take_along_axis(log_probs, y[:, None], axis=1))


k_data, k_model = jax.random.split(jax.random.key(0))
x, y = make_spiral(k_data)
params = init_mlp(k_model, (2, 64, 64, NUM_CLASSES))

# %% [markdown]
# ## Paths
#
# A parameter's identity is its key path joined with `/`.

# %%
{path: leaf.shape for path, leaf in gradtx.paths.leaves(params).items()}

# %% [markdown]
# ## Selectors
#
# Every `mask=`, `where=` and label argument takes a selector. Globs use `*` within a segment and
# `**` across segments; a leading `!` excludes.

# %%
gradtx.paths.select(params, "**/kernel")

# %%
gradtx.paths.select(params, ["**", "!**/bias", "!layers/2"])

# %% [markdown]
# A function of `(path, leaf)` works too, for example to select by shape:

# %%
gradtx.paths.select(params, lambda path, leaf: leaf.ndim == 2 and leaf.shape[0] > 2)

# %% [markdown]
# ## The optimizer
#
# Clip the gradient's global norm, then AdamW with a warm-up + cosine learning-rate schedule and
# weight decay on everything except the biases.

# %%
STEPS = 300
schedule = gradtx.schedules.warmup_cosine_decay(
    init_value=5e-4, peak_value=1e-2, warmup_steps=30, decay_steps=STEPS, end_value=5e-4
)
tx = gradtx.chain(
    gradtx.clip_by_global_norm(1.0),
    gradtx.adamw(schedule, weight_decay=1e-4, mask="!**/bias"),
)
state = tx.init(params)

# %% [markdown]
# The state is keyed by readable names: the combinator's child, the slot, the parameter's path.

# %%
sorted(gradtx.state_dict(state))[:8]

# %% [markdown]
# ## Training
#
# The whole step (loss, gradient, update, apply) is one jitted function.


# %%
@jax.jit
def train_step(params, state, x, y):
    loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
    updates, state = tx.update(grads, state, params)
    return gradtx.apply_updates(params, updates), state, loss


losses, grad_norms = [], []
for _ in range(STEPS):
    params, state, loss = train_step(params, state, x, y)
    losses.append(loss)
    grad_norms.append(gradtx.state_dict(state)["clip_by_global_norm/global_norm"])

losses = np.asarray(jax.device_get(losses))
grad_norms = np.asarray(jax.device_get(grad_norms))
predictions = jnp.argmax(mlp(params, x), axis=1)
acc = float(jnp.mean((predictions == y).astype(jnp.float32)))
print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}, accuracy {acc:.3f}")
assert losses[-1] < 0.25 * losses[0] and acc > 0.9

# %%
fig, (ax_loss, ax_norm) = plt.subplots(1, 2, figsize=(9, 3))
ax_loss.plot(losses)
ax_loss.set(yscale="log", xlabel="step", ylabel="training loss")
ax_norm.plot(grad_norms)
ax_norm.axhline(1.0, color="gray", linestyle="--", label="clip threshold")
ax_norm.set(yscale="log", xlabel="step", ylabel="gradient norm (pre-clip)")
ax_norm.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Checkpoints and edited models
#
# `state_dict` gives a flat `{key: array}` that can be saved with any format; `load_state_dict`
# rebuilds the state and checks every key.

# %%
checkpoint = {key: np.asarray(value) for key, value in gradtx.state_dict(state).items()}
restored, report = gradtx.load_state_dict(tx, params, checkpoint)
print(report)

# %% [markdown]
# After editing the model, `reconcile` keeps the state of every surviving path and initialises
# the new ones. Here the parameters are clipped into a new container (same paths), and a new
# layer is appended (new paths):

# %%
clipped = jax.tree.map(lambda p: jnp.clip(p, -2.0, 2.0), params)
bigger = {"layers": [*clipped["layers"], {"kernel": jnp.eye(NUM_CLASSES), "bias": jnp.zeros(3)}]}
new_state, report = gradtx.reconcile(tx, state, bigger)
print(report)

key = "adamw/nu/layers/0/kernel"
print(key, "kept:", bool(jnp.array_equal(gradtx.state_dict(new_state)[key], checkpoint[key])))
