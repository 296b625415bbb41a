"""Compile for an NVIDIA GPU on a machine that has none: XLA's GPU compiler, without the GPU.

    pip install "jax[cuda12]==$(python -c 'import jax; print(jax.__version__)')"
    JAX_PLATFORMS=cpu JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 \
        python -m benchmarks.lab.compile_probe --gpu-target benchmarks/lab/gpu_targets/h100.txtpb

JAX's CUDA plugin can describe a GPU from a target config (what XLA knows of the device: its
compute capability, cores, memory) and compile for it without a driver. Every compiler pass
runs as on the GPU's host, except autotuning, which needs the device and is skipped: the
compile times are lower than a real GPU's, and the passes' shares of them are what they are
on the GPU. The environment variables keep JAX on the CPU and stop the plugin from checking
the CUDA driver it would run with.

To see which XLA pass takes the time, add `TF_CPP_MIN_LOG_LEVEL=0
TF_CPP_VMODULE=hlo_pass_pipeline=1`: XLA then logs each pass's time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax


def compile_only_device(target_config: str | Path | None) -> Any:
    """A device to compile for, described by a `GpuTargetConfigProto` text file; `None`
    (this machine's devices) without one."""
    if not target_config:
        return None
    from jax.experimental import topologies

    text = Path(target_config).read_text()
    try:
        topology = topologies.get_topology_desc(
            platform="cuda", target_config=text, topology="1x1x1"
        )
    except NotImplementedError as e:  # no CUDA plugin installed
        raise SystemExit(f"compiling for {target_config} needs jax's CUDA plugin: {e}") from e
    return topology.devices[0]


def for_device(device: Any, args: Any) -> tuple[Any, tuple[str, ...] | None]:
    """`args`, and the platforms to lower them for, to compile for `device`.

    With `device` from `compile_only_device`, arrays become `ShapeDtypeStruct`s placed on it
    and the platform is its own (JAX calls an NVIDIA GPU "cuda"); with `None`, `args` are
    unchanged and JAX lowers for its default backend.
    """
    if device is None:
        return args, None
    sharding = jax.sharding.SingleDeviceSharding(device)

    def place(x: Any) -> Any:
        if not hasattr(x, "shape"):
            return x
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)

    platform = "cuda" if device.platform == "gpu" else device.platform
    return jax.tree.map(place, args), (platform,)


def report_head(target_config: str | Path | None) -> tuple[Any, dict]:
    """The device to compile for (`None`: this machine's) and the fields every report of a
    compile starts with: the JAX version, the device compiled for, and the target config."""
    target = compile_only_device(target_config)
    device = target or jax.devices()[0]
    head = {
        "jax": jax.__version__,
        "device": device.device_kind,
        "compiled_here_for": target_config,
    }
    return target, head
