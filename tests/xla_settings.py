"""XLA settings of the test processes: faster-compiling CPU code generation.

Most of the suite's time is XLA compiling small programs that then run for microseconds. XLA's
classic CPU emitters compile them in half the time of its default (fusion) emitters, one LLVM
module per program instead of several compiled side by side spends less processor time on two
busy cores, and LLVM's optimisation level 0 takes a fifth off the rest (the programs' arrays
are tiny, so their run time hardly moves). The programs compute the same thing; the code
generators may round a transcendental function or a sum one float32 ulp apart. The suite's
checks hold under either: references within tolerances that allow float32 rounding, and
bit-for-bit equality only between programs of one compiler.

`GRADTX_TEST_XLA_DEFAULTS=1` runs the suite with XLA's defaults. Child processes (8 devices,
two processes of one job) inherit the settings through the environment; the benchmarks' smoke
runs take XLA's defaults (`with_xla_defaults`), as a user's benchmark would.
"""

from __future__ import annotations

import os
import subprocess
import sys

DEFAULTS_ENV = "GRADTX_TEST_XLA_DEFAULTS"
FAST_COMPILE_FLAGS = (
    "--xla_cpu_use_fusion_emitters=false",
    "--xla_cpu_parallel_codegen_split_count=1",
    "--xla_backend_optimization_level=0",
)


def _joined(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def fast_compile_flags_set() -> bool:
    """True if this process's `XLA_FLAGS` carry `FAST_COMPILE_FLAGS`."""
    flags = os.environ.get("XLA_FLAGS", "")
    return all(f in flags for f in FAST_COMPILE_FLAGS)


def use_fast_compile_flags() -> bool:
    """Add `FAST_COMPILE_FLAGS` to this process's `XLA_FLAGS`, before XLA starts; True if set.

    XLA aborts on a flag it does not know, so a child process tries them first (a later
    jaxlib may drop one); without them the suite runs with XLA's defaults.
    """
    if os.environ.get(DEFAULTS_ENV):
        return False
    if fast_compile_flags_set():
        return True  # set by the first process of the run (workers inherit it)
    wanted = _joined(os.environ.get("XLA_FLAGS", ""), *FAST_COMPILE_FLAGS)
    probe = subprocess.run(
        [sys.executable, "-c", "import jax; jax.jit(lambda x: x + 1)(1.0).block_until_ready()"],
        env={**os.environ, "XLA_FLAGS": wanted},
        capture_output=True,
    )
    if probe.returncode != 0:
        os.environ[DEFAULTS_ENV] = "1"  # the workers need not try again
        return False
    os.environ["XLA_FLAGS"] = wanted
    return True


def with_xla_defaults(env: dict[str, str]) -> dict[str, str]:
    """`env` without `FAST_COMPILE_FLAGS` in its `XLA_FLAGS` (other flags kept)."""
    kept = [f for f in env.get("XLA_FLAGS", "").split() if f not in FAST_COMPILE_FLAGS]
    return {**env, "XLA_FLAGS": " ".join(kept)}
