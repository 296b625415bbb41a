"""Train a small MLP on a synthetic 2-D spiral with gradtx, in pure JAX.

The optimizer is

    gradtx.chain(
        gradtx.clip_by_global_norm(1.0),
        gradtx.adamw(warmup_cosine_decay(...), weight_decay=1e-4, mask="!**/bias"),
    )

and the whole step (loss, gradient, update, apply_updates) is one jitted function. After
training, the parameters are clipped into a new container between two steps (a projection, as
in max-norm constraints); the optimizer state is addressed by parameter path, so Adam's moments
carry over unchanged and training simply continues.

Run it with `make demo`, or `python examples/train_mlp.py --steps 300` for a short run. The
script exits with status 1 if the final accuracy is below `--min-accuracy`.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import gradtx

NUM_CLASSES = 3
HIDDEN = (64, 64)
KERNEL = "layers/0/kernel"  # the parameter whose Adam state is inspected after clipping


# --- data --------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames="per_class")
def make_spiral(key: jax.Array, per_class: int = 200, noise: float = 0.06) -> tuple:
    """Three interleaved spiral arms in the plane: features `(n, 2)`, integer labels `(n,)`."""
    k_radius, k_noise = jax.random.split(key)
    n = per_class * NUM_CLASSES
    labels = jnp.repeat(jnp.arange(NUM_CLASSES, dtype=jnp.int32), per_class)
    radius = jax.random.uniform(k_radius, (n,), minval=0.05, maxval=1.0)
    offset = labels.astype(jnp.float32) * (2 * jnp.pi / NUM_CLASSES)
    angle = offset + 5.0 * radius
    points = jnp.stack([radius * jnp.cos(angle), radius * jnp.sin(angle)], axis=1)
    return points + noise * jax.random.normal(k_noise, (n, 2)), labels


# --- model -------------------------------------------------------------------------------------


@functools.partial(jax.jit, static_argnames="sizes")
def init_mlp(key: jax.Array, sizes: tuple[int, ...]) -> dict:
    """`{"layers": [{"kernel": (d_in, d_out), "bias": (d_out,)}, ...]}`, LeCun-normal kernels."""
    keys = jax.random.split(key, len(sizes) - 1)
    layers = []
    for k, d_in, d_out in zip(keys, sizes[:-1], sizes[1:]):
        kernel = jax.random.normal(k, (d_in, d_out)) / jnp.sqrt(jnp.float32(d_in))
        layers.append({"kernel": kernel, "bias": jnp.zeros((d_out,))})
    return {"layers": layers}


def mlp(params: dict, x: jax.Array) -> jax.Array:
    """Logits of the MLP: tanh hidden layers, a linear output layer."""
    *hidden, last = params["layers"]
    for layer in hidden:
        x = jnp.tanh(x @ layer["kernel"] + layer["bias"])
    return x @ last["kernel"] + last["bias"]


def loss_fn(params: dict, x: jax.Array, y: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy."""
    logits = mlp(params, x)
    log_probs = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(log_probs, y[:, None], axis=1))


@jax.jit
def evaluate(params: dict, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`(loss, accuracy)` on the whole data set."""
    correct = jnp.argmax(mlp(params, x), axis=1) == y
    return loss_fn(params, x, y), jnp.mean(correct.astype(jnp.float32))


@jax.jit
def clip_params(params: dict, limit: float) -> dict:
    """A projection between steps: every value clipped to `[-limit, limit]`, in a new container."""
    return {
        "layers": [
            {name: jnp.clip(value, -limit, limit) for name, value in layer.items()}
            for layer in params["layers"]
        ]
    }


# --- training ----------------------------------------------------------------------------------


def make_optimizer(steps: int, peak_lr: float) -> tuple:
    warmup = max(1, min(100, steps // 10))
    schedule = gradtx.schedules.warmup_cosine_decay(
        init_value=0.05 * peak_lr,
        peak_value=peak_lr,
        warmup_steps=warmup,
        decay_steps=max(steps, warmup + 1),
        end_value=0.05 * peak_lr,
    )
    tx = gradtx.chain(
        gradtx.clip_by_global_norm(1.0),
        gradtx.adamw(schedule, weight_decay=1e-4, mask="!**/bias"),
    )
    return tx, schedule


def make_step(tx: gradtx.Transformation):
    @jax.jit
    def step(params, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return gradtx.apply_updates(params, updates), state, loss

    return step


class Progress:
    """A progress bar written by hand: `\\r`-redrawn on a terminal, periodic lines otherwise."""

    def __init__(self, total: int, width: int = 30, stream=None) -> None:
        self.total, self.width = total, width
        self.stream = sys.stdout if stream is None else stream
        self.tty = self.stream.isatty()
        self.start: float | None = None  # set at the first update, after compilation
        self.first = 0
        self.next_line = 0  # next step (in tenths of `total`) at which a plain line is due

    def update(self, done: int, loss: float) -> None:
        if self.start is None:
            self.start, self.first = time.perf_counter(), done
        elapsed = time.perf_counter() - self.start
        rate = (done - self.first) / elapsed if elapsed > 0 else 0.0
        if self.tty:
            filled = self.width * done // self.total
            bar = "#" * filled + "." * (self.width - filled)
            self.stream.write(
                f"\r[{bar}] {done:>5}/{self.total} loss {loss:.4f} ({rate:,.0f} steps/s)"
            )
            self.stream.flush()
        elif 10 * done >= self.next_line * self.total:
            percent = 100 * done // self.total
            print(
                f"[{percent:>3}%] step {done:>5}/{self.total}  loss {loss:.4f}",
                file=self.stream,
                flush=True,
            )
            self.next_line = 10 * done // self.total + 1

    def message(self, text: str) -> None:
        """Print a line above the bar (the bar is redrawn by the next `update`)."""
        if self.tty:
            self.stream.write("\r" + " " * (self.width + 60) + "\r")
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def train(step, params, state, x, y, steps: int, schedule, progress: Progress) -> tuple:
    """Run `steps` jitted steps; print loss / lr / pre-clip gradient norm at a few checkpoints."""
    checkpoints = {1, steps // 4, steps // 2, (3 * steps) // 4, steps}
    learning_rate = jax.jit(lambda count: schedule(count))
    refresh = max(1, steps // 100)  # host syncs for the bar: about 100 in all
    losses = []
    for i in range(1, steps + 1):
        params, state, loss = step(params, state, x, y)
        if i in checkpoints or i % refresh == 0:
            loss_value = float(loss)
            losses.append((i, loss_value))
            if i in checkpoints:
                stats = gradtx.stats(state)  # every statistic the state keeps, by name
                grad_norm = float(stats["clip_by_global_norm/global_norm"])
                lr = float(learning_rate(i - 1))  # the learning rate used by step i
                progress.message(
                    f"step {i:>5}  loss {loss_value:.4f}  lr {lr:.2e}  "
                    f"grad norm (pre-clip) {grad_norm:.3f}"
                )
            progress.update(i, loss_value)
    progress.close()
    return params, state, losses


# --- main --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500, help="training steps (default 1500)")
    parser.add_argument("--lr", type=float, default=1e-2, help="peak learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--clip", type=float, default=2.0, help="parameter clip value")
    parser.add_argument("--extra-steps", type=int, default=50, help="steps after the clip")
    parser.add_argument(
        "--min-accuracy",
        type=float,
        default=0.9,
        help="exit with status 1 if the final training accuracy is below this",
    )
    args = parser.parse_args(argv)
    if args.steps < 4:
        parser.error("--steps must be at least 4")

    start = time.perf_counter()
    k_data, k_model = jax.random.split(jax.random.key(args.seed))
    x, y = make_spiral(k_data)
    params = init_mlp(k_model, (2, *HIDDEN, NUM_CLASSES))
    tx, schedule = make_optimizer(args.steps, args.lr)
    state = tx.init(params)
    step = make_step(tx)

    n_params = sum(leaf.size for leaf in jax.tree.leaves(params))
    print(f"gradtx {gradtx.__version__} on {jax.default_backend()}: MLP {(2, *HIDDEN, 3)}")
    print(f"{n_params} parameters, {x.shape[0]} points in {NUM_CLASSES} spiral arms")
    print(f"initial loss {float(evaluate(params, x, y)[0]):.4f}, training {args.steps} steps")

    params, state, _ = train(step, params, state, x, y, args.steps, schedule, Progress(args.steps))
    print(f"accuracy after training: {float(evaluate(params, x, y)[1]):.3f}")

    # --- clip the parameters between steps: a new container, new arrays, same paths ---
    print(f"\nclipping every parameter to [-{args.clip}, {args.clip}] (new arrays, new dicts)")
    clipped = clip_params(params, args.clip)
    changed = sum(
        int(np.sum(np.asarray(a) != np.asarray(b)))
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(clipped))
    )
    print(f"{changed} of {n_params} parameter values were clipped")

    # The state is addressed by path; re-deriving it for the clipped tree keeps every entry.
    before = gradtx.state_dict(state)
    state, report = gradtx.reconcile(tx, state, clipped)
    after = gradtx.state_dict(state)
    print(f"reconcile report: {report}")
    for slot in ("mu", "nu"):
        key = f"adamw/{slot}/{KERNEL}"
        first = ", ".join(f"{v:+.3e}" for v in np.asarray(before[key]).ravel()[:3])
        again = ", ".join(f"{v:+.3e}" for v in np.asarray(after[key]).ravel()[:3])
        print(f"{key}[:3] before: {first}  after: {again}")
    kept = before.keys() == after.keys() and all(
        before[k].dtype == after[k].dtype and np.array_equal(before[k], after[k])
        for k in before
        if k.startswith("adamw/")
    )
    print(f"state kept: {kept}")

    params = clipped
    loss_after_clip = float(evaluate(params, x, y)[0])
    for _ in range(args.extra_steps):
        params, state, loss = step(params, state, x, y)
    count = int(gradtx.state_dict(state)[f"adamw/count/{KERNEL}"])
    print(
        f"loss right after the clip {loss_after_clip:.4f}, after {args.extra_steps} more steps "
        f"{float(evaluate(params, x, y)[0]):.4f} (Adam step count of {KERNEL}: {count})"
    )

    final = float(evaluate(params, x, y)[1])
    print(f"final accuracy: {final:.3f}  ({time.perf_counter() - start:.1f} s)")
    if not kept:
        print("FAILED: the optimizer state changed when the parameters were clipped")
        return 1
    if count != args.steps + args.extra_steps:
        print(f"FAILED: expected Adam step count {args.steps + args.extra_steps}, got {count}")
        return 1
    if final < args.min_accuracy:
        print(f"FAILED: final accuracy {final:.3f} is below {args.min_accuracy}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
