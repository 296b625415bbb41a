"""Parameter trees the benchmarks run on (shapes only; values are random)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    shapes: dict[str, tuple[int, ...]]
    dtype: str = "float32"
    state_dtype: str | None = None  # mu/nu dtype when it differs from the params'
    only_configs: tuple[str, ...] | None = None  # run just these configurations (the sweep)
    packed: bool = False  # params (and gradients) as `gradtx.pack` buffers, for both libraries

    @property
    def num_params(self) -> int:
        total = 0
        for shape in self.shapes.values():
            n = 1
            for d in shape:
                n *= d
            total += n
        return total

    @property
    def num_leaves(self) -> int:
        return len(self.shapes)

    def params(self, seed: int = 0) -> dict:
        key = jax.random.PRNGKey(seed)
        out: dict = {}
        for i, (path, shape) in enumerate(self.shapes.items()):
            value = 0.02 * jax.random.normal(jax.random.fold_in(key, i), shape, jnp.float32)
            node = out
            *parents, leaf = path.split("/")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value.astype(self.dtype)
        if self.packed:
            import gradtx

            return gradtx.pack(out)
        return out


def transformer_like(layers: int = 12, width: int = 384, vocab: int = 8192) -> Workload:
    shapes: dict[str, tuple[int, ...]] = {"embed/kernel": (vocab, width)}
    for i in range(layers):
        block = f"blocks/{i}"
        for name, shape in (
            ("attn/qkv/kernel", (width, 3 * width)),
            ("attn/qkv/bias", (3 * width,)),
            ("attn/out/kernel", (width, width)),
            ("attn/out/bias", (width,)),
            ("mlp/up/kernel", (width, 4 * width)),
            ("mlp/up/bias", (4 * width,)),
            ("mlp/down/kernel", (4 * width, width)),
            ("mlp/down/bias", (width,)),
            ("ln1/scale", (width,)),
            ("ln1/bias", (width,)),
            ("ln2/scale", (width,)),
            ("ln2/bias", (width,)),
        ):
            shapes[f"{block}/{name}"] = shape
    shapes["head/kernel"] = (width, vocab)
    shapes["head/bias"] = (vocab,)
    return Workload(f"transformer-like ({layers} blocks)", shapes)


def many_leaves(n: int = 2000) -> Workload:
    shapes = {}
    for i in range(n // 2):
        shapes[f"layers/{i}/kernel"] = (32, 64)
        shapes[f"layers/{i}/bias"] = (2048,)
    return Workload(f"{n} small leaves", shapes)


def many_leaves_packed(n: int = 2000) -> Workload:
    return dataclasses.replace(many_leaves(n), name=f"{n} small leaves, packed", packed=True)


def one_big_leaf(size: int = 32 * 1024 * 1024) -> Workload:
    return Workload("one big leaf", {"w": (size,)})


def bf16_f32_state(layers: int = 12) -> Workload:
    base = transformer_like(layers)
    return Workload("bf16 params, f32 state", base.shapes, "bfloat16", "float32")


def leaf_sweep(total: int = 4 * 1024 * 1024, counts=(100, 500, 2000, 8000)) -> list[Workload]:
    # At 8000 leaves gradtx's per-leaf Adam had not compiled after 20 minutes (a step count
    # per path: see the performance page), so that size runs the bucketed layout only.
    return [
        Workload(
            f"sweep {n} leaves",
            {f"l/{i}": (total // n,) for i in range(n)},
            only_configs=("adam, bucketed state",)
            if n > 2000
            else ("adam", "adam, bucketed state"),
        )
        for n in counts
    ]
