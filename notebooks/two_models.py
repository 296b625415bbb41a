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
# # Two models, one optimizer, no leakage
#
# A generator feeds a critic, and each has its own loss: the critic learns to tell real
# samples from generated ones, and the generator learns to fool it. Both are trained from
# **one** optimizer by alternating partial updates: each step passes gradients for one model
# and `None` for the other. A path without a gradient gets no update, and its optimizer state
# does not move, step counts included. So the result is exactly what two separate optimizers
# give, which the last cell checks bit for bit.

# %%
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt

import gradtx

real = 2.0 + 0.5 * jax.random.normal(jax.random.key(0), (256, 1))  # the data: N(2, 0.5^2)
noise = jax.random.normal(jax.random.key(1), (256, 1))

params = {
    "generator": {"scale": jnp.ones((1, 1)), "shift": jnp.zeros(1)},
    "critic": {"w": 0.1 * jnp.ones((1, 4)), "b": jnp.zeros(4), "v": 0.1 * jnp.ones((4, 1))},
}


def generate(gen, z):
    return z @ gen["scale"] + gen["shift"]


def critic(cri, x):
    return jnp.tanh(x @ cri["w"] + cri["b"]) @ cri["v"]


def critic_loss(cri, gen):
    fake = jax.lax.stop_gradient(generate(gen, noise))
    return jnp.mean(jax.nn.softplus(-critic(cri, real))) + jnp.mean(
        jax.nn.softplus(critic(cri, fake))
    )


def generator_loss(gen, cri):
    return jnp.mean(jax.nn.softplus(-critic(cri, generate(gen, noise))))


tx = gradtx.adam(3e-2, b1=0.5)

# %% [markdown]
# ## Alternating partial updates from one optimizer


# %%
@jax.jit
def critic_step(params, state):
    loss, grads = jax.value_and_grad(critic_loss)(params["critic"], params["generator"])
    partial = {"critic": grads, "generator": {"scale": None, "shift": None}}
    updates, state = tx.update(partial, state, params)
    return gradtx.apply_updates(params, updates), state, loss


@jax.jit
def generator_step(params, state):
    loss, grads = jax.value_and_grad(generator_loss)(params["generator"], params["critic"])
    partial = {"generator": grads, "critic": {"w": None, "b": None, "v": None}}
    updates, state = tx.update(partial, state, params)
    return gradtx.apply_updates(params, updates), state, loss


state = tx.init(params)
history = {"critic": [], "generator": []}
p = params
for _ in range(300):
    p, state, c_loss = critic_step(p, state)
    p, state, g_loss = generator_step(p, state)
    history["critic"].append(float(c_loss))
    history["generator"].append(float(g_loss))

samples = generate(p["generator"], noise)
print(f"generated mean {float(samples.mean()):.2f}, std {float(samples.std()):.2f} (data: 2, 0.5)")
print("step counts:", {k: int(v) for k, v in gradtx.state_dict(state).items() if "count" in k})

fig, ax = plt.subplots(figsize=(6, 3))
for name, values in history.items():
    ax.plot(values, label=name)
ax.set(xlabel="round", ylabel="loss", title="one optimizer, two models")
ax.legend()
plt.show()

# %% [markdown]
# ## The same run with two optimizers
#
# Each model gets an optimizer of its own, and each step the same jitted math. The params
# equal the single-optimizer run's bit for bit: the largest difference is 0.


# %%
@jax.jit
def critic_alone(cri, gen, state):
    grads = jax.grad(critic_loss)(cri, gen)
    updates, state = tx.update(grads, state, cri)
    return gradtx.apply_updates(cri, updates), state


@jax.jit
def generator_alone(gen, cri, state):
    grads = jax.grad(generator_loss)(gen, cri)
    updates, state = tx.update(grads, state, gen)
    return gradtx.apply_updates(gen, updates), state


gen, cri = params["generator"], params["critic"]
gen_state, cri_state = tx.init(gen), tx.init(cri)
for _ in range(300):
    cri, cri_state = critic_alone(cri, gen, cri_state)
    gen, gen_state = generator_alone(gen, cri, gen_state)

pairs = zip(jax.tree.leaves((gen, cri)), jax.tree.leaves((p["generator"], p["critic"])))
print("largest difference:", max(float(jnp.max(jnp.abs(a - b))) for a, b in pairs))
