"""Train one small model under five device layouts with gradtx, and measure what each costs.

The model is a residual MLP (a plain dict of JAX arrays) fitted by `gradtx.adamw` to a fixed
random teacher network on synthetic data. `--layout` picks where params, optimizer state and
batch live:

    single    one device
    dp        data parallel: params replicated, the batch split over the mesh axis "data"
    fsdp      fully sharded: each parameter split over "data" too, on a dim the axis divides
              (and so Adam's moments)
    tp        tensor parallel on a "data" x "model" mesh (2 x 4 on 8 devices): each block's
              up-projection split by columns over "model", its down-projection by rows
              (Megatron style), the batch split over "data"
    dp_zero1  dp with the optimizer state split over "data" (ZeRO-1)

The state is created in place with the shardings `gradtx.state_shardings` computes (with
`shard_over="data"` for dp_zero1), and the step is jitted with those shardings, donating params
and state. The script prints the loss, the per-device bytes of params and state, the compiled
step's memory and the collectives in its HLO (`--show-hlo` prints their lines). Without
accelerators, fake 8 CPU devices:

    XLA_FLAGS=--xla_force_host_platform_device_count=8 JAX_PLATFORMS=cpu \\
        python examples/train_sharded.py --layout dp_zero1

`--checkpoint FILE` also saves the trained params and state with `gradtx.save` and restores
them into the same layout. The script exits with status 1 if the loss is not finite or a
restored array differs from the saved one.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import re
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import gradtx

LAYOUTS = ("single", "dp", "fsdp", "tp", "dp_zero1")
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
OUT = 3  # regression targets: the head's bias (3,) is too small to split, and stays whole
TEACHER_WIDTH = 16


@dataclasses.dataclass(frozen=True)
class Config:
    dim: int = 256
    hidden: int = 1024
    depth: int = 2
    batch: int = 256
    lr: float = 1e-3
    seed: int = 0


# --- data --------------------------------------------------------------------------------------


def batch_at(step: int, config: Config) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of step `step`, made on the host: the same for every layout and host."""
    teacher = np.random.default_rng(config.seed)
    w1 = teacher.normal(size=(config.dim, TEACHER_WIDTH)) / math.sqrt(config.dim)
    w2 = teacher.normal(size=(TEACHER_WIDTH, OUT)) / math.sqrt(TEACHER_WIDTH)
    x = np.random.default_rng([config.seed, step]).normal(size=(config.batch, config.dim))
    y = np.tanh(x @ w1) @ w2
    return x.astype(np.float32), y.astype(np.float32)


# --- model -------------------------------------------------------------------------------------


def init_params(key: jax.Array, config: Config) -> dict:
    """`{"blocks": [{"up": dense, "down": dense}, ...], "head": dense}`, dense = kernel + bias."""
    keys = jax.random.split(key, 2 * config.depth + 1)

    def dense(k, d_in, d_out, scale=1.0):
        kernel = scale * jax.random.normal(k, (d_in, d_out)) / math.sqrt(d_in)
        return {"kernel": kernel, "bias": jnp.zeros((d_out,))}

    blocks = [
        {
            "up": dense(keys[2 * i], config.dim, config.hidden),
            "down": dense(keys[2 * i + 1], config.hidden, config.dim, scale=0.5),
        }
        for i in range(config.depth)
    ]
    return {"blocks": blocks, "head": dense(keys[-1], config.dim, OUT, scale=0.1)}


def forward(params: dict, x: jax.Array) -> jax.Array:
    for block in params["blocks"]:
        h = jax.nn.gelu(x @ block["up"]["kernel"] + block["up"]["bias"])
        x = x + h @ block["down"]["kernel"] + block["down"]["bias"]
    return x @ params["head"]["kernel"] + params["head"]["bias"]


def loss_fn(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean squared error."""
    return jnp.mean((forward(params, x) - y) ** 2)


# --- layouts -----------------------------------------------------------------------------------


def make_mesh(layout: str, devices: list) -> jax.sharding.Mesh:
    # Auto axes: XLA propagates the shardings through the step and inserts the collectives.
    if layout == "single":
        shape, names = (1,), ("data",)
        devices = devices[:1]
    elif layout == "tp":
        model = math.gcd(len(devices), 4)
        shape, names = (len(devices) // model, model), ("data", "model")
    else:
        shape, names = (len(devices),), ("data",)
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), devices=devices)


def param_spec(layout: str, path: str, shape: tuple[int, ...], mesh) -> P:
    """Where the parameter at `path` lives under `layout`."""
    if layout == "fsdp":
        # Split on the first dim the axis divides; a leaf with none (the head's bias) stays whole.
        n = mesh.shape["data"]
        for dim, size in enumerate(shape):
            if size % n == 0:
                return P(*[None] * dim, "data")
    if layout == "tp":
        # Column then row: h = x @ up is split over "model" on its features, each device
        # multiplies its slice of h by its rows of down, and one all-reduce sums the parts.
        if path.endswith("up/kernel"):
            return P(None, "model")
        if path.endswith("up/bias"):
            return P("model")
        if path.endswith("down/kernel"):
            return P("model", None)
    return P()  # replicated


@dataclasses.dataclass
class Run:
    """One layout, set up: the mesh, the shardings, the initial params and state, the step."""

    layout: str
    mesh: Any
    tx: Any
    param_shardings: Any
    state_shardings: Any
    batch_sharding: Any
    params: Any
    state: Any
    step: Any  # the compiled step: (params, state, x, y) -> (params, state, loss)


def setup(layout: str, config: Config, devices: list | None = None) -> Run:
    """Params and optimizer state made in place under `layout`, and the step compiled for it."""
    mesh = make_mesh(layout, list(devices or jax.devices()))
    key = jax.random.key(config.seed)
    # The model's shapes, then their shardings, then the params made in place (nothing is
    # built on one device and copied).
    init = functools.partial(init_params, config=config)
    abstract = jax.eval_shape(init, key)
    param_shardings = gradtx.tree.map_with_path(
        lambda path, x: NamedSharding(mesh, param_spec(layout, path, x.shape, mesh)), abstract
    )
    params = jax.jit(init, out_shardings=param_shardings)(key)

    tx = gradtx.adamw(config.lr, weight_decay=1e-4, mask="**/kernel")
    state_shardings = gradtx.state_shardings(
        tx, params, shard_over="data" if layout == "dp_zero1" else None
    )
    state = jax.jit(tx.init, out_shardings=state_shardings)(params)

    batch_sharding = NamedSharding(mesh, P("data"))
    replicated = NamedSharding(mesh, P())

    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return gradtx.apply_updates(params, updates), state, loss

    jitted = jax.jit(
        step,
        in_shardings=(param_shardings, state_shardings, batch_sharding, batch_sharding),
        out_shardings=(param_shardings, state_shardings, replicated),
        donate_argnums=(0, 1),  # the new params and state reuse the old buffers
    )
    batch = jax.ShapeDtypeStruct((config.batch, config.dim), jnp.float32, sharding=batch_sharding)
    targets = jax.ShapeDtypeStruct((config.batch, OUT), jnp.float32, sharding=batch_sharding)
    compiled = jitted.lower(params, state, batch, targets).compile()
    return Run(
        layout, mesh, tx, param_shardings, state_shardings, batch_sharding, params, state, compiled
    )


def local_rows(sharding, shape: tuple[int, ...]) -> slice:
    """The rows of a global batch that this process's devices hold (all of them on one host)."""
    index = sharding.addressable_devices_indices_map(shape).values()
    rows = [range(shape[0])[i[0]] for i in index]
    return slice(min(r.start for r in rows), max(r.stop for r in rows))


def global_batch(step: int, config: Config, sharding) -> tuple[jax.Array, jax.Array]:
    """Step `step`'s batch as global arrays; each process supplies only the rows it holds.

    The same code runs on one host and on many. A real loader would read only those rows.
    """
    x, y = batch_at(step, config)
    rows = local_rows(sharding, x.shape)
    return tuple(jax.make_array_from_process_local_data(sharding, a[rows], a.shape) for a in (x, y))


def train(run: Run, config: Config, steps: int, log_every: int = 0) -> tuple[Any, Any, float]:
    """`steps` steps from the run's params and state; returns the new ones and the last loss."""
    params, state, loss = run.params, run.state, float("nan")
    for i in range(steps):
        x, y = global_batch(i, config, run.batch_sharding)
        params, state, loss = run.step(params, state, x, y)
        if log_every and ((i + 1) % log_every == 0 or i == 0):
            print(f"step {i + 1:>5}  loss {float(loss):.5f}", flush=True)
    return params, state, float(loss)


# --- measurements ------------------------------------------------------------------------------


def bytes_per_device(tree: Any) -> int:
    """The bytes device 0 holds of `tree`: the size of each leaf's shard there."""
    return sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(tree))


def step_memory(compiled) -> dict[str, int]:
    """XLA's memory analysis of the compiled step, per device (SPMD compiles one program)."""
    m = compiled.memory_analysis()
    return {
        "arguments": m.argument_size_in_bytes,
        "outputs": m.output_size_in_bytes,
        "donated": m.alias_size_in_bytes,
        "temporaries": m.temp_size_in_bytes,
        "peak": m.peak_memory_in_bytes,
        # What the step can hold at once: arguments, outputs not written over donated
        # buffers, and every temporary (the CPU backend's peak leaves temporaries out).
        "bound": m.argument_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
        + m.temp_size_in_bytes,
    }


def collective_lines(hlo: str) -> list[str]:
    """The instructions of the compiled HLO that move data between devices."""
    ops = "|".join(COLLECTIVES)
    pattern = re.compile(rf"\s({ops})(-start)?\(")
    return [line.strip() for line in hlo.splitlines() if pattern.search(line)]


def collectives(hlo: str) -> dict[str, int]:
    """How many of each collective the compiled step runs."""
    lines = collective_lines(hlo)
    return {
        op: sum(bool(re.search(rf"\s{op}(-start)?\(", line)) for line in lines)
        for op in COLLECTIVES
    }


def equal(a: Any, b: Any) -> bool:
    """The same values with the same shardings, leaf by leaf (compared shard by shard)."""
    return all(
        x.sharding.is_equivalent_to(y.sharding, x.ndim)
        and all(
            np.array_equal(s.data, t.data)
            for s, t in zip(x.addressable_shards, y.addressable_shards)
        )
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def size(n: int) -> str:
    return f"{n / 2**20:.2f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


# --- checkpoint --------------------------------------------------------------------------------


def save_and_restore(run: Run, params: Any, state: Any, file: str) -> tuple[Any, Any]:
    """Save with `gradtx.save`; restore into the run's layout with `gradtx.restore`."""
    # `save` reads every array to the host, and a process can read only the shards it holds:
    # gather them from all processes (a no-op on one host) and let process 0 write.
    host_params, host_state = multihost_utils.process_allgather((params, state), tiled=True)
    if jax.process_index() == 0:
        gradtx.save(file, host_params, host_state, tx=run.tx, metadata={"layout": run.layout})
    multihost_utils.sync_global_devices("checkpoint saved")
    # The params come back with the shardings of `params_like`, the state with those that
    # `state_shardings` gives for them (ZeRO-1's split too, with `shard_over`).
    like = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params
    )
    shard_over = "data" if run.layout == "dp_zero1" else None
    restored_params, restored_state, _ = gradtx.restore(
        file, run.tx, like, shard_over=shard_over
    )  # strict
    return restored_params, restored_state


# --- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=LAYOUTS, default="dp")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--devices", type=int, help="use the first N devices (default: all)")
    parser.add_argument("--dim", type=int, default=Config.dim)
    parser.add_argument("--hidden", type=int, default=Config.hidden)
    parser.add_argument("--depth", type=int, default=Config.depth)
    parser.add_argument("--batch", type=int, default=Config.batch)
    parser.add_argument("--log-every", type=int, help="loss every N steps (default: steps/10)")
    parser.add_argument("--show-hlo", action="store_true", help="print the collectives' HLO")
    parser.add_argument("--checkpoint", metavar="FILE", help="save, restore and compare")
    args = parser.parse_args(argv)
    config = Config(dim=args.dim, hidden=args.hidden, depth=args.depth, batch=args.batch)
    devices = jax.devices()[: args.devices]

    start = time.perf_counter()
    run = setup(args.layout, config, devices)
    compile_s = time.perf_counter() - start
    mesh = ", ".join(f"{name}={size}" for name, size in run.mesh.shape.items())
    n_params = sum(x.size for x in jax.tree.leaves(run.params))
    print(
        f"gradtx {gradtx.__version__}, layout {args.layout}: mesh {mesh} on {jax.default_backend()}"
    )
    print(f"{n_params} parameters, batch {config.batch}; set up and compiled in {compile_s:.1f} s")
    print(
        f"per device: params {size(bytes_per_device(run.params))}, "
        f"optimizer state {size(bytes_per_device(run.state))}"
    )
    memory = step_memory(run.step)
    print("compiled step per device: " + ", ".join(f"{k} {size(v)}" for k, v in memory.items()))
    hlo = run.step.as_text()
    print("collectives: " + ", ".join(f"{op} {n}" for op, n in collectives(hlo).items()))
    if args.show_hlo:
        for line in collective_lines(hlo):
            print("  " + line)

    start = time.perf_counter()
    params, state, loss = train(run, config, args.steps, args.log_every or max(1, args.steps // 10))
    jax.block_until_ready((params, state))
    elapsed = time.perf_counter() - start
    baseline = float(np.mean(batch_at(0, config)[1] ** 2))  # the loss of predicting zeros
    print(
        f"final loss {loss:.5f} (predicting zeros: {baseline:.5f}), "
        f"{1e3 * elapsed / max(args.steps, 1):.1f} ms/step"
    )
    if not math.isfinite(loss):
        print("FAILED: the loss is not finite")
        return 1

    if args.checkpoint:
        restored_params, restored_state = save_and_restore(run, params, state, args.checkpoint)
        same = equal(params, restored_params) and equal(state, restored_state)
        print(f"checkpoint {args.checkpoint}: restored in the same layout, equal: {same}")
        if not same:
            print("FAILED: the restored params or state differ from the saved ones")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
