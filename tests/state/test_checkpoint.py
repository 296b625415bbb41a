"""Checkpoint files: gradtx.save and gradtx.restore, the file format, reports and errors."""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx
from gradtx._state import safetensors_format


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Layer:
    w: Any
    b: Any


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class LayerSwapped:
    """`Layer` with its fields in the other order: its leaves flatten as (b, w)."""

    b: Any
    w: Any


def _mixed_params() -> dict:
    """float32, bfloat16, int32 and bool leaves, scalars, a `None`, a list and a dataclass."""
    rng = np.random.default_rng(0)
    return {
        "f32": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32),
        "fb16": jnp.asarray(rng.normal(size=(4,)), jnp.bfloat16),
        "fscalar": jnp.float32(1.5),
        "ids": jnp.arange(5, dtype=jnp.int32),
        "flag": jnp.array([True, False, True]),
        "off": jnp.bool_(True),
        "none": None,
        "nest": {
            "list": [
                jnp.asarray(rng.normal(size=(2,)), jnp.float32),
                Layer(w=jnp.ones((2, 2), jnp.bfloat16), b=jnp.int32(7)),
            ]
        },
    }


def _mixed_tx():
    # Its state holds bool, float32, bfloat16, int32 and uint32 entries.
    inner = gradtx.chain(
        gradtx.clip_by_global_norm(1.0),
        gradtx.add_noise(0.01, 0.55, 0),
        gradtx.adam(1e-2, mu_dtype=jnp.bfloat16),
    )
    return gradtx.masked(inner, ["f32", "fb16", "fscalar", "nest/list/0", "nest/list/1/w"])


def _grads(params: Any, scale: float = 1.0) -> Any:
    def grad(x):
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return None
        return (scale * jnp.cos(x.astype(jnp.float32)) + 0.5).astype(x.dtype)

    return jax.tree.map(grad, params)


def _train(tx: Any, params: Any, state: Any, steps: int = 3) -> tuple[Any, Any]:
    for i in range(steps):
        updates, state = tx.update(_grads(params, 1.0 + i), state, params)
        params = gradtx.apply_updates(params, updates)
    return params, state


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), tree)


def _leaves(tree: Any) -> dict[str, Any]:
    """`{path: leaf}` without the `None` leaves."""
    return {p: x for p, x in gradtx.paths.leaves(tree).items() if x is not None}


def _assert_same_bytes(a: dict, b: dict) -> None:
    """Same keys; each pair of arrays has the same dtype, shape and bytes."""
    assert set(a) == set(b)
    for key in a:
        x, y = np.asarray(a[key]), np.asarray(b[key])
        assert (x.dtype, x.shape) == (y.dtype, y.shape), key
        assert x.tobytes() == y.tobytes(), key


def _header(path: str) -> tuple[dict, int]:
    """The file's JSON header, parsed here independently of gradtx, and where the data starts."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length)), 8 + length


@pytest.fixture
def trained():
    tx, params = _mixed_tx(), _mixed_params()
    params, state = _train(tx, params, tx.init(params))
    return tx, params, state


# --- round trips ---------------------------------------------------------------------------------


def test_round_trip_is_bitwise_for_every_dtype(tmp_path, trained):
    tx, params, state = trained
    file = str(tmp_path / "ckpt.safetensors")
    gradtx.save(file, params, state, tx=tx, metadata={"step": 3, "run": "a"})
    restored, restored_state, report = gradtx.restore(file, _mixed_tx(), _abstract(params))
    assert report.clean, str(report)
    assert report.metadata == {"step": 3, "run": "a"}
    assert jax.tree.structure(restored) == jax.tree.structure(params)
    # (The state's structure may group equal step counts otherwise: see load_state_dict.)
    _assert_same_bytes(_leaves(restored), _leaves(params))
    _assert_same_bytes(gradtx.state_dict(restored_state), gradtx.state_dict(state))
    dtypes = {str(x.dtype) for x in gradtx.state_dict(state).values()}
    assert dtypes == {"bool", "float32", "bfloat16", "int32", "uint32"}
    assert set(report.params_matched) == set(_leaves(params))
    assert set(report.state_matched) == set(gradtx.state_dict(state))
    # Continuing from the restored objects is continuing from the originals.
    a = _train(tx, params, state, steps=2)
    b = _train(tx, restored, restored_state, steps=2)
    _assert_same_bytes(gradtx.state_dict(a), gradtx.state_dict(b))


def test_restore_into_arrays_returns_the_saved_values(tmp_path, trained):
    tx, params, state = trained
    file = str(tmp_path / "ckpt.safetensors")
    gradtx.save(file, params, state, tx=tx)
    fresh = _mixed_params()  # params_like with other values: the file's values win
    restored, _, report = gradtx.restore(file, tx, fresh)
    assert report.clean
    _assert_same_bytes(gradtx.state_dict(restored), gradtx.state_dict(params))
    for path, leaf in _leaves(restored).items():
        assert isinstance(leaf, jax.Array), path
        assert leaf.sharding == _leaves(fresh)[path].sharding


def test_a_step_compiled_before_the_restore_runs_without_compiling_again(tmp_path):
    """Restored into plain (uncommitted) arrays, params and state come back uncommitted, as
    `init` made them: the jitted step's cache key is unchanged. Into committed arrays, they
    come back committed to the same device."""
    tx = gradtx.adam(1e-2)
    params = {"enc": {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}}
    traces = []

    @jax.jit
    def step(params, state):
        traces.append(1)
        updates, state = tx.update(jax.tree.map(jnp.cos, params), state, params)
        return gradtx.apply_updates(params, updates), state

    trained = step(params, tx.init(params))
    file = str(tmp_path / "ckpt.safetensors")
    gradtx.save(file, *trained, tx=tx)
    fresh = {"enc": {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}}
    restored = gradtx.restore(file, tx, fresh)[:2]
    assert not any(x.committed for x in jax.tree.leaves(restored))
    step(*restored)
    assert len(traces) == 1

    device = jax.devices()[0]
    committed = jax.device_put(fresh, device)
    for leaf in jax.tree.leaves(gradtx.restore(file, tx, committed)[:2]):
        assert leaf.committed and leaf.devices() == {device}


def test_file_is_standard_safetensors(tmp_path, trained):
    safetensors = pytest.importorskip("safetensors")
    from safetensors.numpy import load_file

    tx, params, state = trained
    file = str(tmp_path / "ckpt.safetensors")
    gradtx.save(file, params, state, tx=tx, metadata={"step": 3, "config": {"lr": 0.01}})
    header, start = _header(file)
    assert start % 8 == 0
    meta = header.pop("__metadata__")
    assert meta["gradtx.schema"] == "1"
    assert meta["gradtx.fingerprint"].startswith("sha256:")
    assert json.loads(meta["gradtx.metadata"]) == {"step": 3, "config": {"lr": 0.01}}
    expected = {"params/" + k: v for k, v in gradtx.state_dict(params).items()}
    expected |= {"state/" + k: v for k, v in gradtx.state_dict(state).items()}
    assert set(header) == set(expected)
    assert header["params/nest/list/1/w"]["dtype"] == "BF16"
    assert header["params/flag"]["dtype"] == "BOOL"
    assert header["params/fscalar"]["shape"] == []
    assert header["state/adam/count/f32"]["dtype"] == "I32"
    assert header["state/add_noise/rng_key/f32"]["dtype"] == "U32"
    # Every tensor's bytes, read at its offsets without gradtx or safetensors.
    blob = Path(file).read_bytes()[start:]
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        assert blob[begin:end] == np.asarray(expected[name]).tobytes(), name
    assert sum(e["data_offsets"][1] - e["data_offsets"][0] for e in header.values()) == len(blob)

    # The safetensors package reads it: its metadata, and each tensor NumPy can hold.
    with safetensors.safe_open(file, framework="numpy") as f:
        assert f.metadata() == meta
        for name in f.keys():
            if header[name]["dtype"] != "BF16":
                _assert_same_bytes({name: f.get_tensor(name)}, {name: expected[name]})
    plain = {k: v for k, v in _mixed_params().items() if k in ("f32", "fscalar", "ids", "flag")}
    gradtx.save(str(tmp_path / "plain.safetensors"), plain, gradtx.identity().init(plain))
    loaded = load_file(str(tmp_path / "plain.safetensors"))
    _assert_same_bytes(loaded, {"params/" + k: v for k, v in plain.items()})


def test_packed_and_unpacked_params_share_files(tmp_path):
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(1e-2))
    params = {"enc": {"w": jnp.ones((3, 2)), "b": jnp.zeros(2)}, "emb": jnp.ones(4, jnp.bfloat16)}
    packed = gradtx.pack(params)
    packed, state = _train(tx, packed, tx.init(packed))
    unpacked = packed.unpack()
    packed_file, plain_file = str(tmp_path / "packed"), str(tmp_path / "plain")
    gradtx.save(packed_file, packed, state, tx=tx)
    # Unpacked, the same params and state (loaded by path) give the same file.
    plain_state, _ = gradtx.load_state_dict(tx, unpacked, gradtx.state_dict(state))
    gradtx.save(plain_file, unpacked, plain_state, tx=tx)
    assert Path(packed_file).read_bytes() == Path(plain_file).read_bytes()

    restored, restored_state, report = gradtx.restore(packed_file, tx, _abstract(params))
    assert report.clean, str(report)
    _assert_same_bytes(_leaves(restored), _leaves(unpacked))
    _assert_same_bytes(gradtx.state_dict(restored_state), gradtx.state_dict(state))

    repacked, repacked_state, report = gradtx.restore(plain_file, tx, gradtx.pack(params))
    assert report.clean, str(report)
    assert isinstance(repacked, gradtx.Packed)
    _assert_same_bytes(_leaves(repacked.unpack()), _leaves(unpacked))
    _assert_same_bytes(gradtx.state_dict(repacked_state), gradtx.state_dict(state))


# --- matching by path ----------------------------------------------------------------------------


def test_reordered_dict_keys_and_dataclass_fields_get_their_own_moments(tmp_path):
    tx = gradtx.adam(1e-2)
    params = {
        "z": jnp.full(3, 2.0),
        "layers": [Layer(w=jnp.ones((2, 2)), b=jnp.zeros(2)), Layer(w=jnp.ones(3), b=jnp.ones(1))],
        "a": jnp.ones(()),
    }
    params, state = _train(tx, params, tx.init(params))
    file = str(tmp_path / "ckpt")
    gradtx.save(file, params, state, tx=tx)
    moved = {
        "a": jnp.zeros(()),
        "layers": [
            LayerSwapped(b=jnp.zeros(2), w=jnp.zeros((2, 2))),
            LayerSwapped(b=jnp.zeros(1), w=jnp.zeros(3)),
        ],
        "z": jnp.zeros(3),
    }
    # The leaves come in another order (a positional loader would mix them up) ...
    assert [x.shape for x in jax.tree.leaves(moved)] != [x.shape for x in jax.tree.leaves(params)]
    restored, restored_state, report = gradtx.restore(file, tx, moved)
    assert report.clean, str(report)
    assert isinstance(restored["layers"][0], LayerSwapped)
    # ... but each path gets back its own value and moments.
    _assert_same_bytes(_leaves(restored), _leaves(params))
    saved, loaded = gradtx.state_dict(state), gradtx.state_dict(restored_state)
    for slot in ("mu", "nu"):
        for path in ("z", "a", "layers/0/w", "layers/0/b", "layers/1/w", "layers/1/b"):
            key = f"{slot}/{path}"
            np.testing.assert_array_equal(loaded[key], saved[key], err_msg=key)
    assert not np.array_equal(saved["mu/layers/0/w"], saved["mu/layers/1/w"][:2])


def test_rename_moves_a_subtree(tmp_path):
    tx = gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(1e-2))
    params = {"enc": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}, "enc_old": {"w": jnp.ones(2)}}
    params, state = _train(tx, params, tx.init(params))
    file = str(tmp_path / "ckpt")
    gradtx.save(file, params, state, tx=tx)
    like = {
        "model": {"encoder": {"w": jnp.zeros((2, 3)), "b": jnp.ones(3)}},
        "enc_old": {"w": jnp.zeros(2)},
    }
    restored, restored_state, report = gradtx.restore(
        file, tx, like, rename={"enc": "model/encoder/"}
    )
    assert report.clean, str(report)
    np.testing.assert_array_equal(restored["model"]["encoder"]["w"], params["enc"]["w"])
    np.testing.assert_array_equal(restored["enc_old"]["w"], params["enc_old"]["w"])  # not moved
    saved, loaded = gradtx.state_dict(state), gradtx.state_dict(restored_state)
    for slot in ("mu", "nu", "count"):
        for leaf in ("w", "b"):
            old, new = f"adam/{slot}/enc/{leaf}", f"adam/{slot}/model/encoder/{leaf}"
            np.testing.assert_array_equal(loaded[new], saved[old], err_msg=new)
    assert loaded["clip_by_global_norm/global_norm"] == saved["clip_by_global_norm/global_norm"]

    # Without the rename, the moved paths are new and the saved ones dropped.
    with pytest.raises(gradtx.StateMismatchError, match="model/encoder/w") as info:
        gradtx.restore(file, tx, like)
    assert "rename=" in str(info.value)
    assert set(info.value.report.params_dropped) == {"enc/w", "enc/b"}


def test_rename_errors_name_the_prefix(tmp_path):
    tx, params = gradtx.adam(1e-2), {"enc": {"w": jnp.ones(2)}, "dec": {"w": jnp.ones(2)}}
    file = str(tmp_path / "ckpt")
    gradtx.save(file, params, tx.init(params))
    with pytest.raises(ValueError, match=r"`rename` prefixes \['encoder'\] match no params path"):
        gradtx.restore(file, tx, params, rename={"encoder": "x"})
    with pytest.raises(ValueError, match="'(enc|dec)/w' and '(enc|dec)/w' .* both become 'dec/w'"):
        gradtx.restore(file, tx, params, rename={"enc": "dec"})
    with pytest.raises(ValueError, match="`rename` maps path prefixes"):
        gradtx.restore(file, tx, params, rename={"enc": ""})
    with pytest.raises(TypeError, match="`rename` must be a dict"):
        gradtx.restore(file, tx, params, rename=[("enc", "x")])


# --- reports --------------------------------------------------------------------------------------


def _edited(tmp_path):
    """A checkpoint, and params_like with a new, a dropped, a reshaped and a recast path."""
    tx = gradtx.adam(1e-2)
    params = {"keep": jnp.ones(2), "gone": jnp.ones(3), "wide": jnp.ones(2), "cast": jnp.ones(2)}
    params, state = _train(tx, params, tx.init(params))
    file = str(tmp_path / "ckpt")
    gradtx.save(file, params, state, tx=tx, metadata={"step": 3})
    like = {
        "keep": jnp.zeros(2),
        "added": jnp.full(4, 9.0),
        "wide": jnp.full(5, 9.0),
        "cast": jnp.full(2, 9.0, jnp.bfloat16),
    }
    return tx, params, state, file, like


def test_report_lists_new_dropped_and_changed_paths(tmp_path):
    tx, params, state, file, like = _edited(tmp_path)
    restored, restored_state, report = gradtx.restore(file, tx, like, strict=False)
    assert not report.clean
    assert report.params_matched == ("keep",)
    assert report.params_new == ("added",)
    assert report.params_dropped == ("gone",)
    assert report.params_changed == {
        "wide": (((2,), "float32"), ((5,), "float32")),
        "cast": (((2,), "float32"), ((2,), "bfloat16")),
    }
    assert set(report.state_new) == {"count/added", "mu/added", "nu/added"}
    assert set(report.state_dropped) == {"count/gone", "mu/gone", "nu/gone"}
    assert set(report.state_changed) == {"mu/wide", "nu/wide", "mu/cast", "nu/cast"}
    assert set(report.state_matched) == {
        "count/keep",
        "mu/keep",
        "nu/keep",
        "count/wide",
        "count/cast",
    }
    assert report.metadata == {"step": 3} and not report.fingerprint_changed
    # Matched params come from the file; new and changed ones keep params_like's values.
    np.testing.assert_array_equal(restored["keep"], params["keep"])
    for path in ("added", "wide", "cast"):
        assert restored[path] is like[path]
    flat = gradtx.state_dict(restored_state)
    np.testing.assert_array_equal(flat["mu/keep"], gradtx.state_dict(state)["mu/keep"])
    np.testing.assert_array_equal(flat["mu/added"], np.zeros(4, np.float32))
    assert flat["mu/cast"].dtype == jnp.bfloat16


def test_strict_restore_raises_naming_the_paths(tmp_path):
    tx, _, _, file, like = _edited(tmp_path)
    with pytest.raises(gradtx.StateMismatchError, match="does not match") as info:
        gradtx.restore(file, tx, like)
    message = str(info.value)
    assert "params new (1): added" in message
    assert "params dropped (1): gone" in message
    assert "params changed: wide: saved ((2,), 'float32'), expected ((5,), 'float32')" in message
    assert "params changed: cast" in message
    assert "state new (3)" in message and "mu/added" in message
    assert "state dropped (3)" in message and "nu/gone" in message
    assert "state changed: mu/wide" in message
    assert "strict=False" in message
    assert isinstance(info.value.report, gradtx.RestoreReport)
    assert isinstance(info.value, KeyError)  # as load_state_dict's


def test_fingerprint_change_is_reported(tmp_path):
    params = {"w": jnp.ones(3)}
    tx = gradtx.adam(1e-2)
    file = str(tmp_path / "ckpt")
    gradtx.save(file, params, tx.init(params), tx=tx)
    # Another learning rate is not another transformation.
    _, _, report = gradtx.restore(file, gradtx.adam(3e-4), params)
    assert report.clean and not report.fingerprint_changed
    # The same state keys, but another flag.
    other = gradtx.adam(1e-2, nesterov=True)
    with pytest.raises(gradtx.StateMismatchError, match="fingerprint changed"):
        gradtx.restore(file, other, params)
    _, _, report = gradtx.restore(file, other, params, strict=False)
    assert report.fingerprint_changed
    assert not (report.params_new or report.state_new or report.state_dropped)
    # Saved without tx: there is no fingerprint to compare, so the restore is unverified.
    gradtx.save(file, params, tx.init(params))
    assert "gradtx.fingerprint" not in _header(file)[0]["__metadata__"]
    _, _, report = gradtx.restore(file, other, params)
    assert report.matched and not report.verified and not report.clean
    assert not report.fingerprint_changed


def test_shape_only_params_like_cannot_fill_new_paths(tmp_path):
    tx, params = gradtx.adam(1e-2), {"w": jnp.ones(2)}
    file = str(tmp_path / "ckpt")
    gradtx.save(file, params, tx.init(params))
    like = _abstract({"w": jnp.ones(2), "b": jnp.ones(3)})
    with pytest.raises(ValueError, match=r"no usable value for the params \['b'\]"):
        gradtx.restore(file, tx, like, strict=False)


# --- errors and atomic writes ------------------------------------------------------------------


def test_errors_name_the_file_and_the_problem(tmp_path):
    tx, params = gradtx.adam(1e-2), {"w": jnp.ones(2)}
    missing = str(tmp_path / "nope.safetensors")
    with pytest.raises(FileNotFoundError, match="no checkpoint file at .*nope.safetensors"):
        gradtx.restore(missing, tx, params)
    junk = tmp_path / "junk"
    junk.write_bytes(b"\x00" * 3)
    with pytest.raises(ValueError, match="junk' is not a safetensors file: it is 3 bytes"):
        gradtx.restore(str(junk), tx, params)
    junk.write_bytes(struct.pack("<Q", 4) + b"nope")
    with pytest.raises(ValueError, match="its header is not JSON"):
        gradtx.restore(str(junk), tx, params)
    foreign = str(tmp_path / "foreign")
    safetensors_format.write(foreign, {"w": np.ones(2, np.float32)}, {})
    with pytest.raises(ValueError, match="foreign' is a safetensors file but not a gradtx"):
        gradtx.restore(foreign, tx, params)
    future = str(tmp_path / "future")
    safetensors_format.write(future, {"params/w": np.ones(2, np.float32)}, {"gradtx.schema": "99"})
    with pytest.raises(ValueError, match="schema version '99', newer than the version '1'"):
        gradtx.restore(future, tx, params)
    stray = str(tmp_path / "stray")
    tensors = {"opt/w": np.ones(2, np.float32)}
    checksums = json.dumps({"opt/w": safetensors_format.checksum(tensors["opt/w"])})
    safetensors_format.write(stray, tensors, {"gradtx.schema": "1", "gradtx.crc32": checksums})
    with pytest.raises(ValueError, match=r"never writes .*\['opt/w'\]"):
        gradtx.restore(stray, tx, params)


def test_save_errors_name_the_argument(tmp_path):
    params = {"w": jnp.ones(2)}
    state = gradtx.adam(1e-2).init(params)
    file = str(tmp_path / "ckpt")
    with pytest.raises(TypeError, match=r"`metadata\['when'\]` is not JSON-serialisable"):
        gradtx.save(file, params, state, metadata={"when": object()})
    with pytest.raises(TypeError, match="`metadata` must be a dict with str keys"):
        gradtx.save(file, params, state, metadata={1: 2})
    with pytest.raises(TypeError, match="'params/z' has dtype complex128"):
        gradtx.save(file, {"z": np.ones(2, np.complex128)}, ())
    with pytest.raises(FileNotFoundError, match="no directory"):
        gradtx.save(str(tmp_path / "absent" / "ckpt"), params, state)
    assert os.listdir(tmp_path) == []


def test_a_failed_save_leaves_the_old_file_whole(tmp_path, monkeypatch):
    tx, params = gradtx.adam(1e-2), {"w": jnp.ones(2)}
    file = str(tmp_path / "ckpt")
    gradtx.save(file, params, tx.init(params), metadata={"step": 1})
    before = Path(file).read_bytes()

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        gradtx.save(file, {"w": jnp.zeros(2)}, tx.init(params), metadata={"step": 2})
    monkeypatch.undo()
    assert Path(file).read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt"]  # no temporary file left behind
    _, _, report = gradtx.restore(file, tx, params)
    assert report.metadata == {"step": 1}


# --- Orbax ----------------------------------------------------------------------------------------


def test_orbax_recipe_saves_the_state_dict(tmp_path, trained):
    """The state's flat `{key: array}` goes through Orbax and back into gradtx by key."""
    ocp = pytest.importorskip("orbax.checkpoint")
    tx, params, state = trained
    flat = gradtx.state_dict(state)
    checkpointer = ocp.StandardCheckpointer()
    checkpointer.save(tmp_path / "state", flat)
    checkpointer.wait_until_finished()
    # The target gives each leaf's shape, dtype and sharding.
    target = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), flat
    )
    back = checkpointer.restore(tmp_path / "state", target)
    checkpointer.close()
    restored, report = gradtx.load_state_dict(_mixed_tx(), params, back)
    assert report.clean, str(report)
    _assert_same_bytes(gradtx.state_dict(restored), flat)
