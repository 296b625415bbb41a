"""Reading a checkpoint's entries under new names: `restore(..., rename=...)` for moved subtrees."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gradtx._paths.paths import owning_path


def check_rename(rename: Mapping[str, str] | None, owner: str = "restore") -> dict[str, str]:
    """`rename` checked, as `{old prefix: new prefix}` without leading or trailing `/`."""
    if rename is None:
        return {}
    if not isinstance(rename, Mapping):
        raise TypeError(f"{owner}: `rename` must be a dict {{old: new}}, got {rename!r}.")
    moves = {}
    for old, new in rename.items():
        if not (
            isinstance(old, str) and isinstance(new, str) and old.strip("/") and new.strip("/")
        ):
            raise ValueError(
                f"{owner}: `rename` maps path prefixes to path prefixes (non-empty strings "
                f"such as 'enc/layers'), got {old!r}: {new!r}."
            )
        moves[old.strip("/")] = new.strip("/")
    return moves


def apply_rename(
    shown: str, moves: dict, params: dict, state: dict, owner: str = "restore"
) -> tuple[dict, dict]:
    """The saved entries under their new names: params paths, and the path in state keys.

    Args:
        shown: the checkpoint's file name, for errors.
        moves: `check_rename`'s result.
        params: the saved `{params path: array}`.
        state: the saved `{state key: array}`.
        owner: the public function, for errors.

    Returns:
        `(params, state)` with the moved names.
    """
    if not moves:
        return params, state
    used: set[str | None] = set()

    def move(path: str) -> str:
        new, old = _moved(moves, path)
        used.add(old)
        return new

    def move_key(key: str) -> str:
        # A state key ends with the params path it belongs to (`adam/mu/enc/w`); keys of no
        # path (`clip/global_norm`) stay.
        tail = owning_path(key, params)
        return key if tail is None else key[: len(key) - len(tail)] + move(tail)

    new_params = _renamed(shown, params, move, owner)
    new_state = _renamed(shown, state, move_key, owner)
    unused = [old for old in moves if old not in used]
    if unused:
        raise ValueError(
            f"{owner}: `rename` prefixes {unused} match no params path of {shown!r} (its paths "
            f"include {list(params)[:5]}); check them for typos."
        )
    return new_params, new_state


def old_paths(moves: dict, new_paths: list[str]) -> list[str]:
    """The paths that `moves` turns into `new_paths` (each new path read back to its old name)."""
    back = {new: old for old, new in moves.items()}
    return [_moved(back, path)[0] for path in new_paths]


def _moved(moves: Mapping[str, str], path: str) -> tuple[str, str | None]:
    """`path` with its longest prefix in `moves` replaced, and that prefix (None if none).

    A prefix is `path` itself or a folder above it; the longest wins, so
    `{"enc": ..., "enc/head": ...}` moves `enc/head` on its own.
    """
    hits = [p for p in moves if path == p or path.startswith(p + "/")]
    if not hits:
        return path, None
    old = max(hits, key=len)
    return moves[old] + path[len(old) :], old


def _renamed(shown: str, flat: dict, move: Callable[[str], str], owner: str) -> dict:
    out: dict[str, Any] = {}
    names: dict[str, str] = {}
    for name, value in flat.items():
        target = move(name)
        if target in out:
            raise ValueError(
                f"{owner}: with `rename`, {names[target]!r} and {name!r} of {shown!r} both "
                f"become {target!r}."
            )
        out[target], names[target] = value, name
    return out
