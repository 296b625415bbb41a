"""Checkpoint files: params and optimizer state saved by path, restored bit for bit.

One safetensors file holds both. Params are saved by path and the state by `state_dict` key,
so a checkpoint restores into a model whose containers were rebuilt or reordered, packed or
not, and `restore` says what did not match instead of guessing.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gradtx._core.protocol import Params, State
from gradtx._paths.paths import flatten, is_unit
from gradtx._state import safetensors_format
from gradtx._state.fingerprint import describe, diff, hash_description
from gradtx._state.renaming import apply_rename, check_rename
from gradtx._state.restore_report import RestoreReport
from gradtx._state.shardings import is_placed, place_state
from gradtx._state.state_dict import (
    StateMismatchError,
    load_state_dict,
    merge_flat,
    state_dict,
)

# The version of the file's layout (names and metadata keys); `restore` refuses others.
SCHEMA = "1"
_SCHEMA_KEY = "gradtx.schema"
_FINGERPRINT_KEY = "gradtx.fingerprint"
_DESCRIPTION_KEY = "gradtx.transformation"
_CHECKSUMS_KEY = "gradtx.crc32"
_METADATA_KEY = "gradtx.metadata"
_VERSION = re.compile(r"0|[1-9][0-9]*")
_PARAMS, _STATE = "params/", "state/"


def save(
    path: str | os.PathLike,
    params: Params,
    state: State,
    *,
    tx: Any = None,
    metadata: Mapping[str, Any] | None = None,
) -> None:
    """Write params and optimizer state to one checkpoint file, atomically.

    The file is in the safetensors format (readable by the `safetensors` package; nothing in
    it is pickled). Its tensors are `params/<path>` for each parameter (`params/enc/w`) and
    `state/<key>` for each key of `gradtx.state_dict(state)` (`state/adam/mu/enc/w`), each
    with its exact dtype and shape (bfloat16 included). Packed params (`gradtx.pack`) are
    saved per path, so packed and unpacked models share files. `None` leaves are not saved;
    every other params leaf must be an array (or a Python float): for an Equinox module,
    save `eqx.filter(model, eqx.is_array)`. The header's `__metadata__` holds
    `gradtx.schema` (the layout's version), `gradtx.metadata` (`metadata` as JSON),
    `gradtx.crc32` (each tensor's CRC-32 as 8 hex digits, as JSON, which `restore` checks)
    and, given `tx`, `gradtx.transformation` (the transformation's structure and static
    settings as JSON, not its numeric hyperparameters) and `gradtx.fingerprint` (its hash).
    The file is written beside `path` under a temporary name and then renamed, so `path`
    always holds a whole checkpoint.

    Args:
        path: the file to write (its directory must exist); an existing file is replaced.
        params: the params (any pytree of arrays; `gradtx.pack`ed ones too).
        state: the optimizer state, `tx.init(params)` or as updated since.
        tx: the transformation, to store its fingerprint; `restore` then names what
            changed. Without it, `restore` reports the file as not `verified`.
        metadata: a dict of `str` keys and JSON-serialisable values (a step, a config),
            returned by `restore` in `report.metadata`.

    Returns:
        None.

    Examples:
        >>> import os, tempfile
        >>> tx, params = gradtx.adam(1e-3), {"w": jnp.ones(2, jnp.bfloat16)}
        >>> state = tx.init(params)
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     file = os.path.join(folder, "step_10.safetensors")
        ...     gradtx.save(file, params, state, tx=tx, metadata={"step": 10})
        ...     params, state, report = gradtx.restore(file, tx, params)
        >>> params["w"].dtype, report.metadata
        (dtype(bfloat16), {'step': 10})
    """
    header = {_SCHEMA_KEY: SCHEMA, _METADATA_KEY: _encode_metadata(metadata)}
    if tx is not None:
        description = describe(tx)
        header[_DESCRIPTION_KEY] = json.dumps(description, separators=(",", ":"))
        header[_FINGERPRINT_KEY] = hash_description(description)
    # Python floats are params as `init` takes them; ints and bools are a model's settings.
    _check_arrays("save", "params", params, (float,), _SAVE_FIX)
    _check_arrays("save", "state", state, (bool, int, float), "Pass `tx.init(params)`'s state.")
    flat = {_PARAMS + p: x for p, x in state_dict(params).items()}
    flat.update({_STATE + k: x for k, x in state_dict(state).items()})
    tensors = _to_host(flat)
    checksums = {name: safetensors_format.checksum(x) for name, x in tensors.items()}
    header[_CHECKSUMS_KEY] = json.dumps(checksums, separators=(",", ":"))
    safetensors_format.write(path, tensors, header)


def _check_arrays(owner: str, what: str, tree: Any, allowed: tuple[type, ...], fix: str) -> None:
    """Raise naming the first leaf of `tree` that is neither an array nor of an `allowed` type.

    An Equinox model holds functions (activations), ints and strings beside its arrays:
    they are its configuration, not values a file holds.
    """
    for path, leaf in zip(*flatten(tree)[:2]):
        if leaf is None or is_unit(leaf) or isinstance(leaf, (jax.Array, np.ndarray, np.generic)):
            continue
        if not isinstance(leaf, allowed):
            kind = type(leaf).__name__
            article = "an" if kind[:1].lower() in "aeiou" else "a"
            raise TypeError(
                f"{owner}: the {what} leaf at {path!r} is {article} {kind}, not an array: a "
                f"checkpoint holds arrays only. {fix}"
            )


_SAVE_FIX = (
    "For an Equinox module, save `eqx.filter(model, eqx.is_array)`, which keeps its arrays; "
    "elsewhere put `None` there (or a jnp array, if it is a value to keep)."
)
_RESTORE_FIX = (
    "For an Equinox module, restore into `eqx.filter(model, eqx.is_array)` and put the "
    "restored arrays back with `eqx.combine(params, model)`."
)


def _encode_metadata(metadata: Mapping[str, Any] | None) -> str:
    if metadata is None:
        return "{}"
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
        raise TypeError(f"save: `metadata` must be a dict with str keys, got {metadata!r}.")
    for key, value in metadata.items():
        try:
            json.dumps(value)
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"save: `metadata[{key!r}]` is not JSON-serialisable ({e}); store plain "
                "numbers, strings, lists and dicts."
            ) from None
    return json.dumps(dict(metadata))


def _to_host(flat: dict[str, Any]) -> dict[str, np.ndarray]:
    for name, x in flat.items():
        if isinstance(x, jax.Array) and jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
            raise TypeError(
                f"save: {name!r} is a typed PRNG key ({x.dtype}), which has no file dtype; "
                "keep raw keys (jax.random.key_data) in the state."
            )
    fetched = jax.device_get(list(flat.values()))  # one transfer for all arrays
    # Python numbers get JAX's dtypes (float32, int32), as they would inside a step.
    return {
        name: np.asarray(x if isinstance(x, (np.ndarray, np.generic)) else jnp.asarray(x))
        for name, x in zip(flat, fetched)
    }


def restore(
    path: str | os.PathLike,
    tx: Any,
    params_like: Params,
    *,
    strict: bool = True,
    rename: Mapping[str, str] | None = None,
    shard_over: str | None = None,
) -> tuple[Any, Any, RestoreReport]:
    """Read a checkpoint written by `save` into params shaped like `params_like` and tx's state.

    Params are matched by path and rebuilt in `params_like`'s structure (dict order, dataclass
    field order and packing may differ from the saved model's). The state is
    `tx.init(params)` filled from the file by `gradtx.load_state_dict`, key by key. Values
    come back bit for bit, in their saved dtype.

    Every tensor's bytes are checked against the checksum `save` stored, and a damaged file
    raises naming the tensors. The saved transformation's description is compared with
    `tx`'s: the report's `fingerprint_changes` say what differs, by path in the chain
    (`chain/adamw/add_decayed_weights: mask ...`). `bucketed`'s storage layout is no
    difference, so a checkpoint of `bucketed(tx)` restores into `tx` and back when their
    state keys agree (when `tx`'s state is a dict, as every optimizer's and `chain`'s is).
    A file saved without `tx=` cannot be compared: it restores, and its report has
    `verified=False` and is not `clean`.

    Args:
        path: a file written by `gradtx.save` (see there for its layout).
        tx: the transformation the state is for.
        params_like: the params' structure: arrays (a freshly initialised model, whose values
            fill paths the file lacks) or `jax.ShapeDtypeStruct` leaves; packed or not.
            Arrays come back with the sharding of `params_like`'s leaves where the caller
            chose one (an abstract leaf's sharding, or a committed array's); from uncommitted
            arrays, as from plain `jnp` ones, they come back uncommitted, so a step compiled
            before the restore runs on them without compiling again.
        strict: raise `StateMismatchError` unless every params path and state key matches
            and the transformation's fingerprint is unchanged (`report.matched`; a file
            without a fingerprint is not refused for that). With `strict=False`, new and
            changed params keep `params_like`'s values, new and changed state keys are
            initialised, dropped ones are left out, and the report says which.
        rename: `{"old/prefix": "new/prefix"}` for subtrees that moved since the save: a
            saved params path equal to or under `old/prefix` (and the same path inside
            state keys, `adam/mu/old/prefix/w`) is read as if saved under `new/prefix`.
        shard_over: the state comes back placed as `gradtx.state_shardings(tx, params,
            shard_over=shard_over)` says (each slot with its parameter's sharding; with a
            mesh axis, also split over it, ZeRO-1) when `params_like`'s leaves carry
            shardings. It is assembled on the host first, then placed.

    Returns:
        `(params, state, report)`: the params, the state and a `RestoreReport`.

    Raises:
        StateMismatchError: with `strict=True`, what did not match (`.report` says).
        ValueError: the file is damaged (a checksum differs), of another schema version
            (older or newer) or not a gradtx checkpoint.
        TypeError: a leaf of `params_like` is not an array (an Equinox module's function).

    Examples:
        >>> import os, tempfile
        >>> tx = gradtx.adam(1e-3)
        >>> params = {"enc": {"w": jnp.ones(2)}}
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     file = os.path.join(folder, "ckpt.safetensors")
        ...     gradtx.save(file, params, tx.init(params), tx=tx)
        ...     moved = {"encoder": {"w": jnp.zeros(2)}, "head": jnp.zeros(3)}
        ...     params, state, report = gradtx.restore(
        ...         file, tx, moved, strict=False, rename={"enc": "encoder"}
        ...     )
        >>> params["encoder"]["w"], report.params_new
        (Array([1., 1.], dtype=float32), ('head',))
    """
    shown = os.fspath(path)
    moves = check_rename(rename)
    like_types = (float, jax.ShapeDtypeStruct)
    _check_arrays("restore", "params_like", params_like, like_types, _RESTORE_FIX)
    try:
        tensors, header = safetensors_format.read(path)
    except ValueError as e:
        raise ValueError(f"restore: {e} gradtx.save writes the checkpoints restore reads.") from e
    _check_schema(shown, header)
    _check_checksums(shown, header, tensors)
    saved_description, metadata = _read_header(shown, header)
    saved_params, saved_state = _split(shown, tensors)
    saved_params, saved_state = apply_rename(shown, moves, saved_params, saved_state)

    params, found = merge_flat(params_like, saved_params, _place)
    state, loaded = load_state_dict(tx, params, saved_state, strict=False)
    state = place_state(state, tx, params, shard_over=shard_over)
    skipped = set(loaded.unexpected) | set(loaded.mismatched)
    params_skipped = set(found.missing) | set(found.mismatched)
    expected = state_dict(params_like)
    report = RestoreReport(
        params_matched=tuple(p for p in expected if p not in params_skipped),
        params_new=found.missing,
        params_dropped=found.unexpected,
        params_changed=found.mismatched,
        state_matched=tuple(k for k in saved_state if k not in skipped),
        state_new=loaded.missing,
        state_dropped=loaded.unexpected,
        state_changed=loaded.mismatched,
        metadata=metadata,
        **_compare(saved_description, tx),
    )
    if strict and not report.matched:
        raise StateMismatchError(
            report,
            intro=f"restore: the checkpoint {shown!r} does not match the transformation and "
            "params_like",
            hint="Use strict=False to keep params_like's values for new or changed params, "
            "initialise new or changed state and drop the rest (the report says which), or "
            "rename={'old/path': 'new/path'} for subtrees that moved.",
        )
    shapes_only = [p for p, x in expected.items() if isinstance(x, jax.ShapeDtypeStruct)]
    valueless = [p for p in shapes_only if p in params_skipped]
    if valueless:
        raise ValueError(
            f"restore: {shown!r} holds no usable value for the params {valueless[:10]}, "
            "and params_like has only their shapes (jax.ShapeDtypeStruct) there; pass arrays "
            "(a freshly initialised model) for params_like."
        )
    return params, state, report


def _check_schema(shown: str, header: dict[str, str]) -> None:
    """Refuse any file but a gradtx checkpoint of this layout's version, older or newer."""
    version = header.get(_SCHEMA_KEY)
    if version is None:
        raise ValueError(
            f"restore: {shown!r} is a safetensors file but not a gradtx checkpoint (its "
            f"metadata has no {_SCHEMA_KEY!r}); gradtx.save writes the checkpoints restore reads."
        )
    if not _VERSION.fullmatch(version):
        raise ValueError(
            f"restore: {shown!r} has a malformed schema version {version!r} (a gradtx "
            f"checkpoint's {_SCHEMA_KEY!r} is a whole number, {SCHEMA!r} for this gradtx); the "
            "file's header was edited or damaged."
        )
    if version != SCHEMA:
        newer = int(version) > int(SCHEMA)
        raise ValueError(
            f"restore: {shown!r} is a gradtx checkpoint of schema version {version!r}, "
            f"{'newer' if newer else 'older'} than the version {SCHEMA!r} this gradtx reads; "
            f"restore it with the gradtx that wrote it"
            + (" (or a newer one)." if newer else ", and save it again with this one.")
        )


def _check_checksums(shown: str, header: dict[str, str], tensors: dict[str, np.ndarray]) -> None:
    """Raise naming every tensor whose bytes differ from those `save` wrote."""
    text = header.get(_CHECKSUMS_KEY)
    try:
        saved = json.loads(text) if text is not None else None
    except ValueError:
        saved = None
    if not isinstance(saved, dict) or set(saved) != set(tensors):
        detail = (
            f"no {_CHECKSUMS_KEY!r} entry"
            if text is None
            else f"a {_CHECKSUMS_KEY!r} entry that does not list its tensors' checksums"
        )
        raise ValueError(
            f"restore: {shown!r} has {detail} in its metadata, which gradtx.save always "
            "writes: the file's header was edited or damaged, or another program wrote it."
        )
    damaged = sorted(n for n, x in tensors.items() if safetensors_format.checksum(x) != saved[n])
    if damaged:
        more = f" and {len(damaged) - 5} more" if len(damaged) > 5 else ""
        raise ValueError(
            f"restore: {shown!r} is damaged: the bytes of tensor(s) {damaged[:5]}{more} differ "
            "from those gradtx.save wrote (their CRC-32 checksums do not match). The file "
            "changed on disk or in a copy after it was saved; restore an earlier checkpoint."
        )


def _read_header(shown: str, header: dict[str, str]) -> tuple[Any, dict[str, Any]]:
    """The saved description of the transformation (or None), and the user's metadata."""
    try:
        metadata = json.loads(header.get(_METADATA_KEY, "{}"))
    except ValueError:
        raise ValueError(f"restore: {shown!r}: its {_METADATA_KEY!r} is not JSON.") from None
    saved_hash, text = header.get(_FINGERPRINT_KEY), header.get(_DESCRIPTION_KEY)
    if saved_hash is None and text is None:
        return None, metadata
    try:
        description = json.loads(text) if text is not None else None
    except ValueError:
        description = None
    if description is None or hash_description(description) != saved_hash:
        raise ValueError(
            f"restore: {shown!r}: its {_DESCRIPTION_KEY!r} and {_FINGERPRINT_KEY!r} entries "
            "do not agree (gradtx.save writes both, the second the hash of the first): the "
            "file's header was edited or damaged. Restore an earlier checkpoint."
        )
    return description, metadata


def _compare(saved: Any, tx: Any) -> dict[str, Any]:
    """The report's fingerprint fields: what differs from the saved transformation."""
    if saved is None:
        return {"verified": False}
    current = describe(tx)
    if hash_description(saved) == hash_description(current):
        return {}
    return {"fingerprint_changed": True, "fingerprint_changes": tuple(diff(saved, current))}


def _split(shown: str, tensors: dict[str, np.ndarray]) -> tuple[dict, dict]:
    params = {n[len(_PARAMS) :]: x for n, x in tensors.items() if n.startswith(_PARAMS)}
    state = {n[len(_STATE) :]: x for n, x in tensors.items() if n.startswith(_STATE)}
    others = [n for n in tensors if not n.startswith((_PARAMS, _STATE))]
    if others:
        raise ValueError(
            f"restore: {shown!r} holds tensors that gradtx.save never writes (neither "
            f"{_PARAMS}... nor {_STATE}...): {others[:5]}."
        )
    return params, state


def _place(value: np.ndarray, like: Any) -> jax.Array:
    return jax.device_put(value, like.sharding) if is_placed(like) else jnp.asarray(value)
