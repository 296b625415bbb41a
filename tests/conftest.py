"""Strict settings for every test (dtype and rank promotion must be explicit), and a bound on
the compiled programs one test process holds."""

import jax
import pytest

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


# --- compiled programs ---------------------------------------------------------------------------
# Every compiled XLA CPU program keeps about three memory mappings, and a process may hold 65530
# (vm.max_map_count). The contract suite compiles tens of thousands of small programs, and at the
# limit XLA's compiler crashed with a segmentation fault; dropping JAX's caches now and then
# releases them (a later test that needs a program compiles it again).
_MAPS = "/proc/self/maps"
_MAX_MAPS = 30_000


def _mapping_count() -> int:
    try:
        with open(_MAPS) as f:
            return sum(1 for _ in f)
    except OSError:  # not Linux: nothing to watch
        return 0


@pytest.fixture(autouse=True)
def _release_compiled_programs():
    yield
    if _mapping_count() > _MAX_MAPS:
        jax.clear_caches()
