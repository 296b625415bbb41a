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
# # Observing training: gradient norms and evaluation weights
#
# `gradtx.monitor` records statistics of the updates at its place in a chain, inside the
# jitted step; `gradtx.stats` reads them all from the state. Here a monitor before the clip
# gives the raw gradient norm and one after it the clipped norm. A schedule-free optimizer
# trains at one point and is evaluated at another; `gradtx.eval_params` gives the weights to
# evaluate, and the plot shows why that matters.

# %%
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt

import gradtx

x = jax.random.normal(jax.random.key(0), (256, 8))
w_true = jax.random.normal(jax.random.key(1), (8, 1))
y = x @ w_true + 0.1 * jax.random.normal(jax.random.key(2), (256, 1))
params = {
    "hidden": {"w": 0.3 * jax.random.normal(jax.random.key(3), (8, 16)), "b": jnp.zeros(16)},
    "out": {"w": 0.3 * jax.random.normal(jax.random.key(4), (16, 1)), "b": jnp.zeros(1)},
}


def loss_fn(params, x, y):
    h = jnp.tanh(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return jnp.mean((h @ params["out"]["w"] + params["out"]["b"] - y) ** 2)


tx = gradtx.chain(
    gradtx.monitor("raw", ("global_norm", "norm")),
    gradtx.clip_by_global_norm(1.0),
    gradtx.monitor("clipped"),
    gradtx.schedule_free_adamw(2e-2, warmup_steps=20),
)


@jax.jit
def step(params, state, batch):
    bx, by = batch
    loss, grads = jax.value_and_grad(loss_fn)(params, bx, by)
    updates, state = tx.update(grads, state, params)
    params = gradtx.apply_updates(params, updates)
    evaluated = gradtx.eval_params(tx, state, params)
    return params, state, loss, loss_fn(evaluated, x, y), gradtx.stats(state)


# %% [markdown]
# ## Training with minibatches, logging every step

# %%
state = tx.init(params)
log = {"raw": [], "clipped": [], "train point": [], "eval point": []}
for i in range(300):
    idx = jax.random.choice(jax.random.key(10 + i), 256, (32,), replace=False)
    params, state, loss, eval_loss, stats = step(params, state, (x[idx], y[idx]))
    log["raw"].append(float(stats["raw/global_norm"]))
    log["clipped"].append(float(stats["clipped/global_norm"]))
    log["train point"].append(float(loss_fn(params, x, y)))
    log["eval point"].append(float(eval_loss))
print({key: round(value[-1], 4) for key, value in log.items()})
print("clipped steps:", sum(r > 1.0 for r in log["raw"]))

fig, (ax_norm, ax_loss) = plt.subplots(1, 2, figsize=(10, 3))
ax_norm.plot(log["raw"], label="before clip")
ax_norm.plot(log["clipped"], label="after clip")
ax_norm.set(title="gradient norm", xlabel="step", yscale="log")
ax_norm.legend()
ax_loss.plot(log["train point"], label="params (gradient point y)")
ax_loss.plot(log["eval point"], label="eval_params (average x)")
ax_loss.set(title="full-batch loss", xlabel="step", yscale="log")
ax_loss.legend()
plt.show()

# %% [markdown]
# ## Per-path norms, and saving the weights to evaluate
#
# The monitor's per-path norms show which layer the gradient comes from. To save a
# schedule-free model for evaluation, save `eval_params`, not the raw params.

# %%
print({k: round(float(v), 4) for k, v in gradtx.stats(state).items() if "/norm/" in k})
evaluated = gradtx.eval_params(tx, state, params)
print("eval weights differ from the params:", not bool(gradtx.tree.allclose(evaluated, params)))
