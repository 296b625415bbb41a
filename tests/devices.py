"""Run a script in a child process that sees 8 CPU devices (the parent keeps its one)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import gradtx

TESTS = pathlib.Path(__file__).resolve().parent
# The child imports the same gradtx as this process, the test helpers beside this file and the
# contract's registry.
ROOT = pathlib.Path(gradtx.__file__).resolve().parent.parent

# The start of every child script: strict promotion, 8 devices, and `spec_of`.
PRELUDE = r"""
import re

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

jax.config.update("jax_numpy_dtype_promotion", "strict")

import gradtx

assert len(jax.devices()) == 8, jax.devices()


def spec_of(x):
    spec = list(x.sharding.spec)
    while spec and spec[-1] is None:  # P("x") and P("x", None) are the same layout
        spec.pop()
    return tuple(spec)
"""


def cpu_devices_env(count: int = 8) -> dict[str, str]:
    """This process's environment with `count` CPU devices and gradtx on the path."""
    env = dict(os.environ)
    flag = f"--xla_force_host_platform_device_count={count}"
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flag}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(TESTS), str(TESTS / "contract"), *filter(None, [env.get("PYTHONPATH")])]
    )
    return env


def run_on_8_devices(script: str, marker: str, timeout: float = 600) -> str:
    """Run `script` with 8 CPU devices; it must exit cleanly and print `marker`.

    Returns:
        The child's standard output.
    """
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=cpu_devices_env(8),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert marker in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout
