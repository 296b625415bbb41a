"""Resuming from a checkpoint file: k steps, save, restore into fresh objects, k more steps give
bit for bit what 2k uninterrupted steps give, for one registry entry per public name (the
in-memory `state_dict` round trip of every entry is in test_contract.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from registry import PER_NAME, REGISTRY

import gradtx
from gradtx._state.fingerprint import describe, diff, fingerprint, hash_description

# A cross product of the registry: left out of `make quick` (see CONTRIBUTING.md).
pytestmark = pytest.mark.slow

K = 3  # steps before the save, and again after the restore
ROOT = Path(__file__).resolve().parents[2]


def _tree(values: list) -> dict:
    """Nested dicts, a list, a scalar and a `None` leaf (the contract suite's layout)."""
    return {
        "enc": {"w": values[0], "b": values[1]},
        "layers": [{"w": values[2]}, {"w": values[3], "s": values[4]}],
        "frozen": None,
    }


SHAPES = [(3, 4), (4,), (2, 3), (2,), ()]


def _random_tree(rng: np.random.Generator) -> dict:
    return _tree([jnp.asarray(rng.normal(size=s).astype(np.float32)) for s in SHAPES])


PARAMS = _random_tree(np.random.default_rng(0))
GRADS = [_random_tree(np.random.default_rng(1 + i)) for i in range(2 * K)]


def _run(entry: Any, tx: Any, params: Any, state: Any, grads: list) -> tuple[Any, Any, list]:
    history = []
    for g in grads:
        updates, state = tx.update(g, state, params if entry.needs_params else None)
        params = gradtx.apply_updates(params, updates)
        history.append(updates)
    return params, state, history


def _assert_bitwise(a: Any, b: Any) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        x, y = np.asarray(x), np.asarray(y)
        assert (x.dtype, x.shape) == (y.dtype, y.shape)
        assert x.tobytes() == y.tobytes()


def _assert_state_bitwise(a: Any, b: Any) -> None:
    flat_a, flat_b = gradtx.state_dict(a), gradtx.state_dict(b)
    assert set(flat_a) == set(flat_b)
    for key in flat_a:
        x, y = np.asarray(flat_a[key]), np.asarray(flat_b[key])
        assert (x.dtype, x.shape, x.tobytes()) == (y.dtype, y.shape, y.tobytes()), key


@pytest.mark.parametrize("entry", [pytest.param(e, id=e.id) for e in PER_NAME])
def test_resume_from_a_file_is_bitwise(entry, tmp_path):
    tx = entry.make(entry.scalar)
    full_params, full_state, full_updates = _run(entry, tx, PARAMS, tx.init(PARAMS), GRADS)

    mid_params, mid_state, _ = _run(entry, tx, PARAMS, tx.init(PARAMS), GRADS[:K])
    file = tmp_path / "ckpt.safetensors"
    gradtx.save(file, mid_params, mid_state, tx=tx, metadata={"step": K})

    # Fresh objects: a new transformation, and params known only by their shapes.
    fresh = entry.make(entry.scalar)
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), PARAMS)
    params, state, report = gradtx.restore(file, fresh, like)
    assert report.clean and report.metadata == {"step": K}
    params, state, updates = _run(entry, fresh, params, state, GRADS[K:])

    _assert_bitwise(params, full_params)
    _assert_state_bitwise(state, full_state)
    _assert_bitwise(updates, full_updates[K:])


_FINGERPRINTS = """
import json, sys
from registry import REGISTRY
from gradtx._state.fingerprint import fingerprint
json.dump({e.id: fingerprint(e.make(e.scalar)) for e in REGISTRY}, sys.stdout)
"""


def test_fingerprints_are_the_same_in_another_process():
    """No memory address or set order (hash seed) leaks into a fingerprint."""
    env = dict(os.environ, PYTHONHASHSEED="12345", JAX_PLATFORMS="cpu")
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), str(ROOT / "tests"), str(ROOT / "tests" / "contract")]
    )
    out = subprocess.run(
        [sys.executable, "-c", _FINGERPRINTS],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    theirs = json.loads(out.stdout)
    ours = {e.id: fingerprint(e.make(e.scalar)) for e in REGISTRY}
    assert theirs == ours


@pytest.mark.parametrize("entry", [pytest.param(e, id=e.id) for e in PER_NAME])
def test_descriptions_round_trip_through_the_header_and_ignore_bucketed(entry):
    """What `save` writes into the header is JSON that gives back the fingerprint, and
    `bucketed` (a storage layout) neither changes it nor shows in a diff."""
    tx = entry.make(entry.scalar)
    description = describe(tx)
    stored = json.loads(json.dumps(description, separators=(",", ":")))
    assert stored == description
    assert hash_description(stored) == fingerprint(tx)
    assert fingerprint(gradtx.bucketed(tx)) == fingerprint(tx)
    assert diff(stored, describe(gradtx.bucketed(tx, own_buffer_from=None))) == []
