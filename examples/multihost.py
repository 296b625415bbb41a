"""Train the model of train_sharded.py on several processes at once, as on several hosts.

Every process runs this same program. `jax.distributed.initialize` connects them; after it,
`jax.devices()` lists the devices of all processes, the mesh spans them all, and each process
feeds only the rows of the global batch that its own devices hold
(`jax.make_array_from_process_local_data`, in `train_sharded.global_batch`). Params and
optimizer state are global arrays: under `--layout fsdp` or `dp_zero1` no process holds all
of them.

On one machine, two processes with 4 CPU devices each stand in for two hosts:

    python examples/multihost.py --launch 2 --layout dp_zero1

starts, for I = 0 and 1,

    XLA_FLAGS=--xla_force_host_platform_device_count=4 JAX_PLATFORMS=cpu \\
        python examples/multihost.py --coordinator localhost:PORT --num-processes 2 \\
        --process-id I --layout dp_zero1

On a cluster, run that second command on each host, with host 0's address as coordinator
(and without the two variables). With `--out DIR`, each process writes the trained params,
gathered from all processes, to `DIR/params_I.npz`; with `--checkpoint FILE` (a path that all
processes see), process 0 saves params and state there with `gradtx.save`, and every process
restores them into the same layout and compares.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import train_sharded  # the model, layouts and step, from this folder
from jax.experimental import multihost_utils


def launch(count: int, devices: int, args: list[str]) -> int:
    """Run `count` processes of this script on this machine, each with `devices` CPU devices."""
    with socket.socket() as s:  # a free port for the coordinator
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--coordinator", f"localhost:{port}"]
            + ["--num-processes", str(count), "--process-id", str(i), *args],
            env=env,
        )
        for i in range(count)
    ]
    while any(p.poll() is None for p in procs):
        if any(p.returncode for p in procs):  # one failed: the others would wait for it
            for p in procs:
                if p.poll() is None:
                    p.terminate()
        time.sleep(0.1)
    return max((p.returncode for p in procs), key=abs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launch", type=int, metavar="N", help="start N local processes")
    parser.add_argument("--local-devices", type=int, default=4, help="CPU devices per process")
    parser.add_argument("--coordinator", help="host:port of process 0")
    parser.add_argument("--num-processes", type=int)
    parser.add_argument("--process-id", type=int)
    parser.add_argument("--layout", choices=train_sharded.LAYOUTS[1:], default="dp_zero1")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--dim", type=int, default=train_sharded.Config.dim)
    parser.add_argument("--hidden", type=int, default=train_sharded.Config.hidden)
    parser.add_argument("--batch", type=int, default=train_sharded.Config.batch)
    parser.add_argument("--out", type=Path, help="write the trained params here")
    parser.add_argument("--checkpoint", help="save, restore and compare (a shared file)")
    args = parser.parse_args(argv)
    if args.launch:
        same = ["--layout", args.layout, "--steps", str(args.steps), "--dim", str(args.dim)]
        same += ["--hidden", str(args.hidden), "--batch", str(args.batch)]
        same += ["--out", str(args.out)] if args.out else []
        same += ["--checkpoint", args.checkpoint] if args.checkpoint else []
        return launch(args.launch, args.local_devices, same)

    # Collectives between processes on CPU go through Gloo (GPUs and TPUs bring their own).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(args.coordinator, args.num_processes, args.process_id)
    me = jax.process_index()
    print(
        f"process {me} of {jax.process_count()}: {len(jax.local_devices())} local devices, "
        f"{len(jax.devices())} in all",
        flush=True,
    )

    config = train_sharded.Config(dim=args.dim, hidden=args.hidden, batch=args.batch)
    run = train_sharded.setup(args.layout, config)  # a mesh over jax.devices(): all processes
    start = time.perf_counter()
    log_every = max(1, args.steps // 5) if me == 0 else 0  # one process reports progress
    params, state, loss = train_sharded.train(run, config, args.steps, log_every)
    jax.block_until_ready((params, state))
    elapsed = time.perf_counter() - start
    print(
        f"process {me}: final loss {loss:.5f}, per device: params "
        f"{train_sharded.size(train_sharded.bytes_per_device(params))}, optimizer state "
        f"{train_sharded.size(train_sharded.bytes_per_device(state))}, "
        f"{1e3 * elapsed / max(args.steps, 1):.1f} ms/step",
        flush=True,
    )
    if args.out:
        # Every process takes part in the gather; each then holds the whole params.
        gathered = multihost_utils.process_allgather(params, tiled=True)
        flat = {
            jax.tree_util.keystr(path, simple=True, separator="/"): np.asarray(leaf)
            for path, leaf in jax.tree_util.tree_leaves_with_path(gathered)
        }
        args.out.mkdir(parents=True, exist_ok=True)
        np.savez(args.out / f"params_{me}.npz", **flat)
    ok = bool(np.isfinite(loss))
    if args.checkpoint:
        restored = train_sharded.save_and_restore(run, params, state, args.checkpoint)
        same = train_sharded.equal((params, state), restored)
        print(f"process {me}: checkpoint restored in the same layout, equal: {same}", flush=True)
        ok = ok and same
    jax.distributed.shutdown()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
