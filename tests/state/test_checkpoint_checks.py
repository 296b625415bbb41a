"""What `gradtx.restore` checks before trusting a file: checksums, the schema version, the
saved transformation (and what changed in it), and that params are arrays."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gradtx
from gradtx._state import safetensors_format
from gradtx._state.fingerprint import describe, diff, fingerprint, hash_description

PARAMS = {
    "enc": {"w": jnp.arange(6.0).reshape(3, 2), "b": jnp.linspace(-1.0, 1.0, 2)},
    "emb": jnp.arange(4.0, dtype=jnp.bfloat16),
    "scale": jnp.float32(1.5),
}


def _clipped(tx: Any) -> Any:
    return gradtx.chain(gradtx.clip_by_global_norm(1.0), tx)


def _train(tx: Any, params: Any, state: Any, steps: int = 3) -> tuple[Any, Any]:
    for i in range(steps):
        grads = jax.tree.map(
            lambda x, i=i: (jnp.cos(x.astype(jnp.float32)) + i).astype(x.dtype), params
        )
        updates, state = tx.update(grads, state, params)
        params = gradtx.apply_updates(params, updates)
    return params, state


def _saved(
    tmp_path: Path, tx: Any, params: Any = PARAMS, *, with_tx: bool = True
) -> tuple[str, Any, Any]:
    """A file of `params` and `tx`'s state after a few steps (saved with `tx=tx`)."""
    params, state = _train(tx, params, tx.init(params))
    file = str(tmp_path / "ckpt.safetensors")
    gradtx.save(file, params, state, tx=tx if with_tx else None)
    return file, params, state


def _header(path: str) -> tuple[dict, int]:
    """The file's JSON header, parsed without gradtx, and where the data starts."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(length)), 8 + length


def _rewrite_metadata(file: str, **changes: str | None) -> None:
    """Rewrite `file` with some `__metadata__` entries changed (None removes one)."""
    tensors, metadata = safetensors_format.read(file)
    for key, value in changes.items():
        key = key.replace("_", ".", 1)  # gradtx_schema -> gradtx.schema
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    safetensors_format.write(file, tensors, metadata)


def _assert_same_state(a: Any, b: Any) -> None:
    flat_a, flat_b = gradtx.state_dict(a), gradtx.state_dict(b)
    assert sorted(flat_a) == sorted(flat_b)
    for key, x in flat_a.items():
        x, y = np.asarray(x), np.asarray(flat_b[key])
        assert (x.dtype, x.shape, x.tobytes()) == (y.dtype, y.shape, y.tobytes()), key


# --- checksums ------------------------------------------------------------------------------------


def test_checksums_are_the_crc32_of_each_tensors_stored_bytes(tmp_path):
    file, _, _ = _saved(tmp_path, _clipped(gradtx.adam(1e-2)))
    header, start = _header(file)
    checksums = json.loads(header.pop("__metadata__")["gradtx.crc32"])
    assert set(checksums) == set(header)
    blob = Path(file).read_bytes()[start:]
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        assert checksums[name] == f"{zlib.crc32(blob[begin:end]):08x}", name


@pytest.mark.parametrize(
    "name", ["params/enc/w", "params/emb", "params/scale", "state/adam/nu/enc/b"]
)
def test_a_flipped_byte_in_a_tensor_is_refused_naming_it(tmp_path, name):
    tx = _clipped(gradtx.adam(1e-2))
    file, _, _ = _saved(tmp_path, tx)
    gradtx.restore(file, tx, PARAMS)  # whole, it restores
    header, start = _header(file)
    begin, end = header[name]["data_offsets"]
    data = bytearray(Path(file).read_bytes())
    data[start + (begin + end) // 2] ^= 0x04  # one bit, in the middle of the tensor
    Path(file).write_bytes(bytes(data))
    for strict in (True, False):
        with pytest.raises(ValueError, match="is damaged") as info:
            gradtx.restore(file, tx, PARAMS, strict=strict)
        message = str(info.value)
        assert f"[{name!r}]" in message  # that tensor and no other
        assert "restore an earlier checkpoint" in message


def test_every_damaged_tensor_is_named(tmp_path):
    tx = gradtx.adam(1e-2)
    file, _, _ = _saved(tmp_path, tx)
    header, start = _header(file)
    data = bytearray(Path(file).read_bytes())
    for name in ("params/enc/b", "state/mu/emb"):
        data[start + header[name]["data_offsets"][0]] ^= 0x80
    Path(file).write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"\['params/enc/b', 'state/mu/emb'\]"):
        gradtx.restore(file, tx, PARAMS)


@pytest.mark.parametrize(
    ("checksums", "match"),
    [
        (None, "has no 'gradtx.crc32' entry"),
        ("not json", "'gradtx.crc32' entry that does not list"),
        ('{"params/enc/w": "00000000"}', "'gradtx.crc32' entry that does not list"),
    ],
)
def test_missing_or_edited_checksums_are_refused(tmp_path, checksums, match):
    tx = gradtx.adam(1e-2)
    file, _, _ = _saved(tmp_path, tx)
    _rewrite_metadata(file, gradtx_crc32=checksums)
    with pytest.raises(ValueError, match=match):
        gradtx.restore(file, tx, PARAMS)


def test_a_checksum_of_another_tensor_is_refused(tmp_path):
    tx = gradtx.adam(1e-2)
    file, _, _ = _saved(tmp_path, tx)
    checksums = json.loads(safetensors_format.read(file)[1]["gradtx.crc32"])
    checksums["params/enc/w"], checksums["params/enc/b"] = (
        checksums["params/enc/b"],
        checksums["params/enc/w"],
    )
    _rewrite_metadata(file, gradtx_crc32=json.dumps(checksums))
    with pytest.raises(ValueError, match=r"\['params/enc/b', 'params/enc/w'\]"):
        gradtx.restore(file, tx, PARAMS)


# --- schema versions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "match"),
    [
        ("0", r"schema version '0', older than the version '1'.* save it again"),
        ("2", r"schema version '2', newer than the version '1'.* \(or a newer one\)"),
        ("10", r"schema version '10', newer than"),
        ("1.0", "malformed schema version '1.0'"),
        ("01", "malformed schema version '01'"),
        (" 1", "malformed schema version ' 1'"),
        ("-1", "malformed schema version '-1'"),
        ("one", "malformed schema version 'one'"),
        ("", "malformed schema version ''"),
        (None, "is a safetensors file but not a gradtx checkpoint"),
    ],
)
def test_any_schema_version_but_this_one_is_refused(tmp_path, version, match):
    tx = gradtx.adam(1e-2)
    file, _, _ = _saved(tmp_path, tx)
    _rewrite_metadata(file, gradtx_schema="1")
    gradtx.restore(file, tx, PARAMS)  # the rewrite itself keeps the file whole
    _rewrite_metadata(file, gradtx_schema=version)
    for strict in (True, False):
        with pytest.raises(ValueError, match=match):
            gradtx.restore(file, tx, PARAMS, strict=strict)


# --- the saved transformation ---------------------------------------------------------------------


def test_a_file_saved_without_tx_restores_unverified(tmp_path):
    saved_with = _clipped(gradtx.adamw(1e-2, weight_decay=0.1, mask="**/w"))
    other_mask = _clipped(gradtx.adamw(1e-2, weight_decay=0.1, mask="**/b"))
    file, params, state = _saved(tmp_path, saved_with, with_tx=False)
    restored, restored_state, report = gradtx.restore(file, other_mask, PARAMS)
    # Every key matched, but nothing says the transformation did.
    assert report.matched and not report.fingerprint_changed
    assert not report.verified and not report.clean
    assert "unverified" in str(report) and "tx=" in str(report)
    _assert_same_state(restored_state, state)
    # Saved with tx, the same restore is refused, naming the mask.
    gradtx.save(file, params, state, tx=saved_with)
    with pytest.raises(gradtx.StateMismatchError, match="chain/adamw/add_decayed_weights: mask"):
        gradtx.restore(file, other_mask, PARAMS)
    _, _, report = gradtx.restore(file, saved_with, PARAMS)
    assert report.verified and report.clean and "unverified" not in str(report)


_BOOLS = {"enc": {"w": True, "b": False}, "emb": True, "scale": False}

# (saved with, restored into, the report's lines, whether the state keys stay the same)
CHANGES = [
    pytest.param(
        _clipped(gradtx.adam(1e-2)),
        _clipped(gradtx.nadam(1e-2)),
        ("chain/1: adam -> nadam",),
        False,
        id="another-step",
    ),
    pytest.param(
        gradtx.adam(1e-2),
        gradtx.nadam(1e-2),
        ("nadam: label 'adam' -> 'nadam'", "nadam/scale_by_adam: nesterov False -> True"),
        True,
        id="a-flag",
    ),
    pytest.param(
        _clipped(gradtx.adamw(1e-2, mask="**/w")),
        _clipped(gradtx.adamw(1e-2, mask=["**/w", "emb"])),
        ("chain/adamw/add_decayed_weights: mask '**/w' -> ['**/w', 'emb']",),
        True,
        id="a-glob-mask",
    ),
    pytest.param(
        gradtx.adamw(1e-2, mask=_BOOLS),
        gradtx.adamw(1e-2, mask={**_BOOLS, "emb": False}),
        (
            "adamw/add_decayed_weights: mask <bool tree selecting ['emb', 'enc/w'] of 4 paths>"
            " -> <bool tree selecting ['enc/w'] of 4 paths>",
        ),
        True,
        id="a-bool-tree-mask",
    ),
    pytest.param(
        gradtx.adam(1e-2),
        gradtx.adam(1e-2, nu_dtype=jnp.float32),
        ("adam/scale_by_adam: nu_dtype None -> dtype('float32')",),
        True,
        id="a-state-dtype",
    ),
    pytest.param(
        gradtx.adam(1e-2),
        gradtx.adam(gradtx.schedules.linear(1e-2, 1e-3, 10)),
        ("adam/scale_by_learning_rate/learning_rate: a value -> Polynomial",),
        False,
        id="a-schedule",
    ),
    pytest.param(
        _clipped(gradtx.adam(1e-2)),
        gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(1e-2), gradtx.scale(0.5)),
        (
            "chain: steps ['clip_by_global_norm', 'adam'] -> "
            + "['clip_by_global_norm', 'adam', 'scale']",
        ),
        True,
        id="a-step-added",
    ),
    pytest.param(
        gradtx.bucketed(_clipped(gradtx.adam(1e-2))),
        gradtx.bucketed(_clipped(gradtx.adam(1e-2, nesterov=True))),
        ("chain/adam/scale_by_adam: nesterov False -> True",),
        True,
        id="inside-bucketed",
    ),
]


@pytest.mark.parametrize(("saved_with", "restored_with", "changes", "same_keys"), CHANGES)
def test_a_changed_transformation_is_named_by_its_path(
    tmp_path, saved_with, restored_with, changes, same_keys
):
    # With `same_keys`, the state's keys, shapes and dtypes are unchanged (float32 params):
    # only the fingerprint can tell.
    params = {"enc": PARAMS["enc"], "emb": jnp.ones(4), "scale": PARAMS["scale"]}
    file, _, _ = _saved(tmp_path, saved_with, params)
    with pytest.raises(gradtx.StateMismatchError, match="fingerprint changed") as info:
        gradtx.restore(file, restored_with, params)
    for line in changes:
        assert f"\n  {line}" in str(info.value)
    _, _, report = gradtx.restore(file, restored_with, params, strict=False)
    assert report.fingerprint_changed and report.fingerprint_changes == changes
    keys_changed = report.state_new or report.state_dropped or report.state_changed
    assert bool(keys_changed) is not same_keys
    assert report.verified and not report.matched and not report.clean


def test_the_same_transformation_with_other_numbers_is_no_change(tmp_path):
    tx = _clipped(gradtx.adamw(1e-2, weight_decay=0.1, mask="**/w"))
    file, _, _ = _saved(tmp_path, tx)
    again = _clipped(gradtx.adamw(3e-4, b1=0.8, weight_decay=0.5, mask="**/w"))
    _, _, report = gradtx.restore(file, again, PARAMS)
    assert report.clean and report.fingerprint_changes == ()


def test_the_header_holds_the_description_and_its_hash(tmp_path):
    tx = _clipped(gradtx.adamw(1e-2, mask="**/w"))
    file, _, _ = _saved(tmp_path, tx)
    meta = _header(file)[0]["__metadata__"]
    description = json.loads(meta["gradtx.transformation"])
    assert description == describe(tx)
    assert meta["gradtx.fingerprint"] == hash_description(description) == fingerprint(tx)
    assert [name for name, _ in description["children"]] == ["clip_by_global_norm", "adamw"]
    assert len(meta["gradtx.transformation"]) < 2000  # small: it lives in the header


def test_a_description_that_disagrees_with_its_hash_is_refused(tmp_path):
    tx = gradtx.adam(1e-2)
    file, _, _ = _saved(tmp_path, tx)
    edited = describe(gradtx.adam(1e-2, nesterov=True))
    _rewrite_metadata(file, gradtx_transformation=json.dumps(edited))
    with pytest.raises(ValueError, match="'gradtx.transformation' and 'gradtx.fingerprint'"):
        gradtx.restore(file, tx, PARAMS, strict=False)
    _rewrite_metadata(file, gradtx_transformation=None)
    with pytest.raises(ValueError, match="do not agree"):
        gradtx.restore(file, tx, PARAMS, strict=False)


def test_diff_names_steps_settings_and_groups():
    partition = gradtx.partition(
        {"a": gradtx.adam(1e-3), "b": gradtx.sgd(1e-2)}, {"a": "enc/**", "b": "!enc/**"}
    )
    other = gradtx.partition(
        {"a": gradtx.adam(1e-3, nesterov=True), "b": gradtx.sgd(1e-2)},
        {"a": "enc/**", "b": "!enc/**"},
    )
    assert diff(describe(partition), describe(other)) == [
        "partition/a/scale_by_adam: nesterov False -> True"
    ]
    assert diff(describe(gradtx.scale_by_adam()), describe(gradtx.scale_by_lion())) == [
        "scale_by_lion: scale_by_adam (ScaleByAdam) -> scale_by_lion (ScaleByLion)"
    ]
    masked = gradtx.masked(gradtx.adam(1e-3), "enc/**")
    assert diff(describe(masked), describe(gradtx.masked(gradtx.adam(1e-3), "emb"))) == [
        "masked: mask 'enc/**' -> 'emb'"
    ]
    assert diff(describe(masked), describe(masked)) == []


# --- bucketed -------------------------------------------------------------------------------------


def test_the_fingerprint_ignores_bucketed_storage():
    tx = _clipped(gradtx.adamw(1e-2, mask="**/w"))
    same = {
        fingerprint(t)
        for t in (
            tx,
            gradtx.bucketed(tx),
            gradtx.bucketed(tx, own_buffer_from=None),
        )
    }
    assert len(same) == 1
    assert fingerprint(gradtx.bucketed(tx)) != fingerprint(_clipped(gradtx.adamw(1e-2)))


@pytest.mark.parametrize("direction", ["bucketed-to-tree", "tree-to-bucketed"])
def test_a_bucketed_checkpoint_restores_into_the_tree_layout_and_back(tmp_path, direction):
    tx = _clipped(gradtx.adamw(1e-2, weight_decay=0.1, mask="**/w"))
    saved_with, restored_with = (
        (gradtx.bucketed(tx), tx) if direction == "bucketed-to-tree" else (tx, gradtx.bucketed(tx))
    )
    file, params, state = _saved(tmp_path, saved_with)
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), PARAMS)
    restored, restored_state, report = gradtx.restore(file, restored_with, like)  # strict
    assert report.clean, str(report)
    assert not report.fingerprint_changed
    _assert_same_state(restored_state, state)
    _assert_same_state(restored, params)
    # The restored state steps on as the saved layout's does.
    grads = jax.tree.map(jnp.sin, params)
    ours, _ = restored_with.update(grads, restored_state, restored)
    theirs, _ = saved_with.update(grads, state, params)
    for path, x in gradtx.state_dict(ours).items():
        np.testing.assert_allclose(x, gradtx.state_dict(theirs)[path], rtol=1e-6, err_msg=path)


# --- params that are not arrays -------------------------------------------------------------------


def test_save_names_a_non_array_leaf_and_suggests_the_filter(tmp_path):
    file = str(tmp_path / "ckpt")
    tx = gradtx.adam(1e-2)
    state = tx.init({"w": jnp.ones(2)})
    for params, path, kind in (
        ({"w": jnp.ones(2), "act": jax.nn.relu}, "act", "a custom_jvp"),
        ({"w": jnp.ones(2), "depth": 3}, "depth", "an int"),
        ({"w": jnp.ones(2), "name": "mlp"}, "name", "a str"),
    ):
        with pytest.raises(TypeError, match="eqx.filter\\(model, eqx.is_array\\)") as info:
            gradtx.save(file, params, state, tx=tx)
        assert f"the params leaf at {path!r} is {kind}, not an array" in str(info.value)
    assert not (tmp_path / "ckpt").exists()
    with pytest.raises(TypeError, match="the state leaf at 'mu/w' is a builtin_function_or_method"):
        gradtx.save(file, {"w": jnp.ones(2)}, {"mu": {"w": len}})
    gradtx.save(file, {"w": jnp.ones(2), "lr_scale": 0.5}, state)  # a Python float is a param


def test_an_equinox_model_saves_and_restores_through_its_filter(tmp_path):
    eqx = pytest.importorskip("equinox")

    class Block(eqx.Module):
        linear: eqx.nn.Linear
        activation: Any
        depth: int

    def model(seed):
        return Block(eqx.nn.Linear(3, 2, key=jax.random.key(seed)), jax.nn.gelu, 2)

    tx = gradtx.adam(1e-2)
    trained = model(0)
    params = eqx.filter(trained, eqx.is_inexact_array)
    state = tx.init(params)
    file = str(tmp_path / "ckpt")
    with pytest.raises(TypeError, match="leaf at 'activation' is a .*eqx.is_array"):
        gradtx.save(file, trained, state, tx=tx)
    gradtx.save(file, eqx.filter(trained, eqx.is_array), state, tx=tx)
    fresh = model(1)
    with pytest.raises(TypeError, match="params_like leaf at 'activation' .*eqx.combine"):
        gradtx.restore(file, tx, fresh)
    arrays, _, report = gradtx.restore(file, tx, eqx.filter(fresh, eqx.is_array))
    assert report.clean, str(report)
    back = eqx.combine(arrays, fresh)
    np.testing.assert_array_equal(back.linear.weight, trained.linear.weight)
    assert back.activation is jax.nn.gelu and back.depth == 2


@pytest.mark.parametrize("count", [5, 6])
def test_many_damaged_tensors_show_five_and_count_the_rest(tmp_path, count):
    tx = gradtx.adam(1e-2)
    file, _, _ = _saved(tmp_path, tx)
    header, start = _header(file)
    names = sorted(n for n in header if n != "__metadata__")[:count]
    data = bytearray(Path(file).read_bytes())
    for name in names:
        data[start + header[name]["data_offsets"][0]] ^= 0x80
    Path(file).write_bytes(bytes(data))
    with pytest.raises(ValueError) as info:
        gradtx.restore(file, tx, PARAMS)
    message = str(info.value)
    assert str(names[:5]) in message
    assert (" more differ" in message) == (count == 6), message
    assert count == 5 or " and 1 more differ" in message
