"""Where a model says its optimizer state lives: Flax NNX's `optimizer_sharding` metadata.

Flax lets a parameter declare a sharding for its optimizer state apart from its own
(`nnx.with_metadata(init, optimizer_sharding=P("data"))`): data-parallel training keeps the
params whole on every device and splits their moments (ZeRO-1). Its `nnx.Optimizer` honours
it for optax's state, whose leaves are the params' `Variable`s; gradtx's state is keyed by
path instead, so the state tools read the metadata here, by path, and lay out the slots of
that parameter from it (`state_shardings`, and the outermost `init`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import jax
from jax.sharding import NamedSharding, PartitionSpec

from gradtx._core.protocol import Params
from gradtx._paths.paths import is_path_transparent, path_of

DECLARED = "optimizer_sharding"  # the metadata key Flax NNX gives it


def _as_spec(path: str, value: Any) -> PartitionSpec | NamedSharding:
    if isinstance(value, (PartitionSpec, NamedSharding)):
        return value
    if isinstance(value, (tuple, list)):  # Flax's sharding names: ("data", None)
        return PartitionSpec(*value)
    raise ValueError(
        f"the parameter at path {path!r} declares {DECLARED}={value!r}; give a "
        "`PartitionSpec`, a tuple of mesh axis names (None for a whole dimension), or a "
        "`NamedSharding`."
    )


def declared_specs(params: Params) -> dict[str, PartitionSpec | NamedSharding]:
    """`{path: spec}` for the parameters whose box declares `optimizer_sharding`.

    Boxes are Flax NNX `Variable`s (an `nnx.State` holds one per parameter); the path is the
    box's own (`l1/kernel`), as everywhere in gradtx. Any other params give `{}`.

    Examples:
        >>> from gradtx._state.flax_sharding import declared_specs
        >>> declared_specs({"w": jnp.zeros(2)})
        {}
    """
    found = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_path_transparent)[0]
    out: dict[str, PartitionSpec | NamedSharding] = {}
    for key_path, node in found:
        metadata = getattr(node, "get_metadata", None)
        if not is_path_transparent(node) or not callable(metadata):
            continue
        value = cast("Mapping[str, Any]", metadata()).get(DECLARED)  # a Variable's dict
        if value is not None:
            path = path_of(key_path)
            out[path] = _as_spec(path, value)
    return out


def _context_mesh() -> Any:
    """The mesh set by `jax.set_mesh` (concrete when there is one), or None."""
    for get in ("get_mesh", "get_abstract_mesh"):
        try:
            mesh = getattr(jax.sharding, get)()
        except (AttributeError, ValueError):  # `get_mesh` refuses to run under `jit`
            continue
        if mesh is not None and not mesh.empty:
            return mesh
    return None


def declared_shardings(
    declared: dict[str, PartitionSpec | NamedSharding], shardings: dict[str, Any]
) -> dict[str, NamedSharding]:
    """The declared specs as shardings, on the parameter's mesh (else the one set).

    Args:
        declared: `declared_specs(params)`.
        shardings: `{path: the parameter's own sharding, or None}`.

    Raises:
        ValueError: a declared spec with no mesh to put it on, naming the path.
    """
    out = {}
    for path, spec in declared.items():
        if isinstance(spec, NamedSharding):
            out[path] = spec
            continue
        own = shardings.get(path)
        mesh = own.mesh if isinstance(own, NamedSharding) else _context_mesh()
        if mesh is None:
            raise ValueError(
                f"the parameter at path {path!r} declares {DECLARED}={spec}, but neither "
                "its own sharding nor a mesh set with `jax.set_mesh(mesh)` says which mesh "
                "that spec is on; create the model and the optimizer under `jax.set_mesh`."
            )
        out[path] = NamedSharding(mesh, spec)
    return out
