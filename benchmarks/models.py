"""Models for the whole-model training benchmarks (`benchmarks/whole_model.py`).

Each workload is built by a function returning a `Workload`: the initial params (a pytree of
arrays only), a pure `loss(params, batch)`, a fixed batch of synthetic data, and how to move
the params to and from the plain nested form that `gradtx.pack` takes.

- `gpt`: a GPT-style language model in Flax NNX, about 150 leaves (20M params at full size).
- `mlp`: an Equinox residual MLP of many small layers (2000 leaves at full size).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
from flax import nnx


@dataclasses.dataclass
class Workload:
    """A model to train: what every variant of the benchmark starts from.

    Attributes:
        params: the trainable arrays (a pytree of arrays only).
        loss: `loss(params, batch) -> scalar`, pure (safe to jit and differentiate).
        batch: the fixed synthetic batch every step trains on.
        value_and_grad: how the model's own library differentiates `loss` in its first
            argument.
        to_plain: the params as a nested dict/module of arrays, for `gradtx.pack`.
        from_plain: the inverse of `to_plain`, as `loss` takes it (traced inside the step).
        config: the sizes, for the report.
    """

    params: Any
    loss: Callable[[Any, Any], jax.Array]
    batch: Any
    value_and_grad: Callable = jax.value_and_grad
    to_plain: Callable[[Any], Any] = lambda p: p
    from_plain: Callable[[Any], Any] = lambda p: p
    config: dict = dataclasses.field(default_factory=dict)


# --- GPT-style transformer in Flax NNX -----------------------------------------------------------


class Block(nnx.Module):
    """Pre-LayerNorm transformer block: causal self-attention, then a gelu MLP."""

    def __init__(self, width: int, heads: int, rngs: nnx.Rngs) -> None:
        self.heads = heads
        self.ln1 = nnx.LayerNorm(width, rngs=rngs)
        self.qkv = nnx.Linear(width, 3 * width, rngs=rngs)
        self.proj = nnx.Linear(width, width, rngs=rngs)
        self.ln2 = nnx.LayerNorm(width, rngs=rngs)
        self.up = nnx.Linear(width, 4 * width, rngs=rngs)
        self.down = nnx.Linear(4 * width, width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        b, t, d = x.shape
        qkv = self.qkv(self.ln1(x)).reshape(b, t, 3, self.heads, d // self.heads)
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        # XLA's own attention on every platform (no cuDNN kernel): the same math everywhere.
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
        x = x + self.proj(y.reshape(b, t, d))
        return x + self.down(jax.nn.gelu(self.up(self.ln2(x))))


class GPT(nnx.Module):
    """Token and learned position embeddings, `depth` blocks, final LayerNorm, untied head."""

    def __init__(
        self, vocab: int, context: int, width: int, depth: int, heads: int, rngs: nnx.Rngs
    ) -> None:
        self.embed = nnx.Embed(vocab, width, rngs=rngs)
        self.pos = nnx.Param(0.02 * jax.random.normal(rngs.params(), (context, width)))
        self.blocks = nnx.List([Block(width, heads, rngs) for _ in range(depth)])
        self.ln_f = nnx.LayerNorm(width, rngs=rngs)
        self.head = nnx.Linear(width, vocab, rngs=rngs)

    def __call__(self, tokens: jax.Array) -> jax.Array:
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def gpt(
    smoke: bool = False,
    *,
    vocab: int = 8192,
    context: int = 128,
    width: int = 320,
    depth: int = 12,
    heads: int = 5,
    batch: int = 8,
    seed: int = 0,
) -> Workload:
    """The GPT workload: next-token cross-entropy on a fixed batch of random tokens.

    Full size: 12 blocks of 12 leaves plus 6 others (150 leaves), about 20.1M params. The
    params are an `nnx.State` from `nnx.split(model, nnx.Param)`; the loss merges them back
    into the module.
    """
    if smoke:
        vocab, context, width, depth, heads, batch = 256, 16, 64, 2, 2, 4
    model = GPT(vocab, context, width, depth, heads, nnx.Rngs(seed))
    graphdef, params = nnx.split(model, nnx.Param)
    tokens = jax.random.randint(jax.random.key(seed + 1), (batch, context + 1), 0, vocab)

    def loss(params: Any, tokens: jax.Array) -> jax.Array:
        logits = nnx.merge(graphdef, params)(tokens[:, :-1])
        logp = jax.nn.log_softmax(logits.astype(jnp.float32))
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    return Workload(
        params=params,
        loss=loss,
        batch=tokens,
        to_plain=nnx.to_pure_dict,
        # `nnx.merge` takes the pure dict as it is: no need to rebuild an `nnx.State`.
        from_plain=lambda p: p,
        config={
            "vocab": vocab,
            "context": context,
            "width": width,
            "depth": depth,
            "heads": heads,
            "batch": batch,
        },
    )


# --- Equinox MLP of many small layers ------------------------------------------------------------


class ResidualMLP(eqx.Module):
    """`depth` residual layers `x + tanh(linear(x)) / sqrt(depth)` of one width."""

    layers: list

    def __init__(self, depth: int, width: int, key: jax.Array) -> None:
        self.layers = [eqx.nn.Linear(width, width, key=k) for k in jax.random.split(key, depth)]

    def __call__(self, x: jax.Array) -> jax.Array:
        # Branches scaled by 1/sqrt(depth) keep the activations and gradients O(1) however
        # deep the stack, so the loss stays finite at 1000 layers.
        scale = 1.0 / math.sqrt(len(self.layers))
        for layer in self.layers:
            x = x + scale * jnp.tanh(x @ layer.weight.T + layer.bias)
        return x


def mlp(
    smoke: bool = False, *, depth: int = 1000, width: int = 32, batch: int = 64, seed: int = 0
) -> Workload:
    """The many-leaf workload: a residual MLP regressing a fixed random target.

    Two leaves per layer (a (32, 32) weight and a (32,) bias): 2000 leaves at full size.
    The params are the array part of `eqx.partition(model, eqx.is_array)`; the loss combines
    them with the static part.
    """
    if smoke:
        depth = 20
    model = ResidualMLP(depth, width, jax.random.key(seed))
    params, static = eqx.partition(model, eqx.is_array)
    kx, kw = jax.random.split(jax.random.key(seed + 1))
    x = jax.random.normal(kx, (batch, width))
    y = jnp.sin(x @ jax.random.normal(kw, (width, width)) / math.sqrt(width))

    def loss(params: Any, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
        x, y = batch
        return jnp.mean((eqx.combine(params, static)(x) - y) ** 2)

    return Workload(
        params=params,
        loss=loss,
        batch=(x, y),
        value_and_grad=eqx.filter_value_and_grad,
        config={"depth": depth, "width": width, "batch": batch},
    )
