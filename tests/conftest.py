"""Strict settings for every test (dtype and rank promotion must be explicit), test data seeded
per test, faster-compiling XLA settings (tests/xla_settings.py), one compilation cache shared
by the run's processes, and a bound on the compiled programs one process holds."""

import os
import shutil
import tempfile
import zlib

import jax
import numpy as np
import pytest
from xla_settings import fast_compile_flags_set, use_fast_compile_flags

jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")


# --- one compilation cache for the whole run ------------------------------------------------------
# The suite compiles thousands of small programs, most of them more than once: in each of the
# test processes (pytest-xdist), and again after `_release_compiled_programs` drops JAX's
# caches. JAX's persistent compilation cache, in a directory that lives as long as the run,
# turns those repeats into reads (a third less test time). The first process (the xdist
# controller, or a serial run) makes the directory, its workers inherit it through the
# environment, and it is removed at the end. Programs compiled by the code under test are the
# same either way; a cache entry that cannot be read is compiled again (pyproject's warning
# filters let that pass instead of failing the test).
_CACHE_DIR_ENV = "GRADTX_TEST_COMPILATION_CACHE"
_owns_cache_dir = False


def pytest_report_header(config: pytest.Config) -> str:
    fast = fast_compile_flags_set()
    return f"XLA CPU code generation: {'fast-compile flags' if fast else 'XLA defaults'}"


def pytest_configure(config: pytest.Config) -> None:
    global _owns_cache_dir
    use_fast_compile_flags()  # before any test starts XLA (see tests/xla_settings.py)
    if _CACHE_DIR_ENV not in os.environ:
        os.environ[_CACHE_DIR_ENV] = tempfile.mkdtemp(prefix="gradtx-tests-xla-")
        _owns_cache_dir = True
    jax.config.update("jax_compilation_cache_dir", os.environ[_CACHE_DIR_ENV])
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def pytest_unconfigure(config: pytest.Config) -> None:
    if _owns_cache_dir:
        shutil.rmtree(os.environ.pop(_CACHE_DIR_ENV), ignore_errors=True)


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


# --- test data that does not depend on the order of the tests ---------------------------------
# A module's generator `RNG` gives each test the draws the tests before it left. Which tests
# those are depends on the selection (`-k`) and on how pytest-xdist shares them out, and a test
# that passed in one order failed in another (a sum of clipped examples that cancelled).
# Each test starts the generator again from a seed of its own id.
@pytest.fixture(autouse=True)
def _rng_seeded_per_test(request: pytest.FixtureRequest) -> None:
    if isinstance(getattr(request.module, "RNG", None), np.random.Generator):
        request.module.RNG = np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


# --- the longest tests first ---------------------------------------------------------------------
# Tests that run child processes (8 CPU devices, the demo, the benchmarks' smoke runs, two
# processes of one job) take tens of seconds to minutes each. Started last, one of them keeps a
# worker busy while the other idles; started first, the many short tests fill in around them.
# The sort is stable and the same in every worker (xdist requires the same order everywhere).
_LONG_FIRST = (
    "test_state_shardings.py",
    "test_sharded_training.py",
    "test_sharded_layouts.py",
    "test_state_follows_param_sharding.py",
    "test_benchmarks_smoke.py",
    "test_demo.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.path.name not in _LONG_FIRST)
