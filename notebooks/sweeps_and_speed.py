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
# # Sweeps in one program, and speed against optax
#
# A gradtx transformation keeps its numeric hyperparameters as leaves, so `jax.vmap` over
# its constructor gives a *stack* of optimizers, and `jax.vmap` over the training loop trains
# one model per learning rate in a single compiled program. The second part runs a small
# benchmark of gradtx against optax and plots it from the benchmark's JSON.

# %%
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt

import gradtx

x = jax.random.normal(jax.random.key(0), (128, 4))
y = jnp.sin(x @ jnp.array([[1.0], [-2.0], [0.5], [1.5]]))
init = {
    "hidden": {"w": 0.5 * jax.random.normal(jax.random.key(1), (4, 32)), "b": jnp.zeros(32)},
    "out": {"w": 0.5 * jax.random.normal(jax.random.key(2), (32, 1)), "b": jnp.zeros(1)},
}


def loss_fn(params):
    h = jnp.tanh(x @ params["hidden"]["w"] + params["hidden"]["b"])
    return jnp.mean((h @ params["out"]["w"] + params["out"]["b"] - y) ** 2)


def train_curve(tx, params, steps=150):
    def body(carry, _):
        params, state = carry
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, state = tx.update(grads, state, params)
        return (gradtx.apply_updates(params, updates), state), loss

    _, losses = jax.lax.scan(body, (params, tx.init(params)), None, length=steps)
    return losses


# %% [markdown]
# ## Eight learning rates, one compiled program

# %%
learning_rates = jnp.geomspace(1e-3, 3e-1, 8)
optimizers = jax.vmap(lambda lr: gradtx.adam(lr))(learning_rates)
curves = jax.jit(jax.vmap(train_curve, in_axes=(0, None)))(optimizers, init)
print("final losses:", [round(float(c[-1]), 4) for c in curves])

one = train_curve(gradtx.adam(float(learning_rates[3])), init)
print("slice 3 equals its own run:", bool(jnp.allclose(curves[3], one, rtol=1e-5)))

fig, ax = plt.subplots(figsize=(6, 3))
for lr, curve in zip(learning_rates, curves):
    ax.plot(curve, label=f"{float(lr):.0e}")
ax.set(xlabel="step", ylabel="loss", yscale="log", title="adam, one program")
ax.legend(title="learning rate", fontsize=7, ncol=2)
plt.show()

# %% [markdown]
# ## gradtx against optax
#
# `python -m benchmarks.run` times the same optimizers in gradtx and optax side by side, in
# one process, alternating between them, and writes its figures as JSON. Here its smoke
# version (tiny sizes, two configurations) runs in a few seconds; the performance page has
# the full run.

# %%
root = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "benchmarks").is_dir())
out = Path(tempfile.mkdtemp()) / "smoke.json"
command = [sys.executable, "-m", "benchmarks.run", "--smoke", "--no-training", "--out", str(out)]
command += ["--config", "adam", "--config", "lion"]
subprocess.run(command, cwd=root, check=True, capture_output=True)
rows = json.loads(out.read_text())["results"]

labels = [f"{r['workload']}\n{r['config']}" for r in rows]
positions = range(len(rows))
fig, ax = plt.subplots(figsize=(9, 3.5))
ax.bar([p - 0.2 for p in positions], [r["gradtx_donated_ms"] for r in rows], 0.4, label="gradtx")
ax.bar([p + 0.2 for p in positions], [r["optax_donated_ms"] for r in rows], 0.4, label="optax")
ax.set_xticks(list(positions), labels, fontsize=7)
ax.set(ylabel="ms per donated jitted step", yscale="log", title="smoke-sized workloads")
ax.legend()
plt.show()
for r in rows:
    ratio = r["gradtx_donated_ms"] / r["optax_donated_ms"]
    print(f"{r['workload']:<28} {r['config']:<6} gradtx / optax = {ratio:.2f}")
