"""The tree zoo: awkward params trees that every tree-level operation must handle.

Each `ZooTree` has a readable id, a builder and the paths of its leaves written out by hand
(in JAX's flattening order, `None` leaves included), so the path rendering itself is checked
against an independent statement of what it should be.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


def _array(shape: tuple, seed: int, dtype: Any = jnp.float32) -> jax.Array:
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.normal(size=shape).astype(np.float32), dtype)


class Layer(NamedTuple):
    w: Any
    b: Any


@dataclasses.dataclass
class Dense:
    """A dataclass registered with `jax.tree_util.register_dataclass`; `name` is static."""

    kernel: Any
    bias: Any
    name: str = "dense"


jax.tree_util.register_dataclass(Dense, data_fields=["kernel", "bias"], meta_fields=["name"])


class Linear:
    """An Equinox-like module: array attributes are children keyed by attribute name, the
    non-array `activation` is static (part of the treedef), and the module is callable."""

    def __init__(self, weight: Any, bias: Any, activation: str = "tanh") -> None:
        self.weight = weight
        self.bias = bias
        self.activation = activation

    def __call__(self, x: jax.Array) -> jax.Array:
        y = self.weight @ x + self.bias
        return jnp.tanh(y) if self.activation == "tanh" else y

    def __repr__(self) -> str:
        return f"Linear(activation={self.activation!r})"


def _linear_flatten_with_keys(m: Linear) -> tuple:
    keys = jax.tree_util.GetAttrKey
    return ((keys("weight"), m.weight), (keys("bias"), m.bias)), m.activation


def _linear_flatten(m: Linear) -> tuple:
    return (m.weight, m.bias), m.activation


def _linear_unflatten(activation: str, children: Any) -> Linear:
    m = object.__new__(Linear)
    m.weight, m.bias = children
    m.activation = activation
    return m


jax.tree_util.register_pytree_with_keys(
    Linear, _linear_flatten_with_keys, _linear_unflatten, _linear_flatten
)


class MLP:
    """An Equinox-like module holding a list of modules under the attribute `layers`."""

    def __init__(self, layers: list) -> None:
        self.layers = layers

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x)
        return x


jax.tree_util.register_pytree_with_keys(
    MLP,
    lambda m: (((jax.tree_util.GetAttrKey("layers"), m.layers),), None),
    lambda _, children: MLP(*children),
    lambda m: ((m.layers,), None),
)


@dataclasses.dataclass(frozen=True)
class ZooTree:
    id: str
    make: Callable[[], Any]
    paths: tuple[str, ...]

    def __str__(self) -> str:
        return self.id


ZOO: tuple[ZooTree, ...] = (
    ZooTree(
        "dict-of-lists",
        lambda: {
            "enc": {
                "layers": [
                    {"w": _array((2, 3), 0), "b": _array((3,), 1)},
                    {"w": _array((3, 2), 2), "b": _array((2,), 3)},
                ]
            },
            "head": {"w": _array((2,), 4)},
        },
        ("enc/layers/0/b", "enc/layers/0/w", "enc/layers/1/b", "enc/layers/1/w", "head/w"),
    ),
    ZooTree(
        "namedtuple",
        lambda: {
            "layer": Layer(_array((2, 2), 5), _array((2,), 6)),
            "out": [Layer(_array((2, 1), 7), _array((1,), 8))],
        },
        ("layer/w", "layer/b", "out/0/w", "out/0/b"),
    ),
    ZooTree(
        "dataclass",
        lambda: {"dense": Dense(_array((3, 2), 9), _array((2,), 10), name="proj")},
        ("dense/kernel", "dense/bias"),
    ),
    ZooTree(
        "equinox-like",
        lambda: MLP(
            [
                Linear(_array((3, 2), 11), _array((3,), 12)),
                Linear(_array((1, 3), 13), _array((1,), 14), activation="identity"),
            ]
        ),
        ("layers/0/weight", "layers/0/bias", "layers/1/weight", "layers/1/bias"),
    ),
    ZooTree(
        "none-leaves",
        lambda: {"a": _array((2,), 15), "frozen": None, "sub": [None, _array((3,), 16)]},
        ("a", "frozen", "sub/0", "sub/1"),
    ),
    ZooTree(
        "scalars",
        lambda: {"s": _array((), 17), "t": [_array((), 18)], "v": _array((2,), 19)},
        ("s", "t/0", "v"),
    ),
    ZooTree(
        "zero-size",
        lambda: {"empty": jnp.zeros((0, 3), jnp.float32), "w": _array((2,), 20)},
        ("empty", "w"),
    ),
    ZooTree(
        "mixed-bf16-f32",
        lambda: {
            "w16": _array((2, 3), 21, jnp.bfloat16),
            "b32": _array((3,), 22),
            "s16": _array((), 23, jnp.bfloat16),
        },
        ("b32", "s16", "w16"),
    ),
    ZooTree(
        "tuple-root",
        lambda: (_array((2,), 24), [_array((2, 2), 25), {"z": _array((1,), 26)}]),
        ("0", "1/0", "1/1/z"),
    ),
)


def colliding() -> dict:
    """Two leaves with the same path `a/0`: the dict key "a/0" and index 0 of the list "a"."""
    return {"a/0": _array((2,), 27), "a": [_array((2,), 28)]}


def grads_like(tree: Any, seed: int = 100) -> Any:
    """Gradients shaped like `tree` (same dtypes, `None` where the tree has `None`)."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef.unflatten([_array(np.shape(x), seed + i, x.dtype) for i, x in enumerate(leaves)])
