"""Immutable pytree objects: the base of transformations and schedules.

A `Module` subclass is a frozen dataclass registered as a pytree. Its fields are either
*data* (pytree children: arrays, numeric hyperparameters, sub-transformations, schedules) or
*static* (hashable structure kept in the treedef: selectors, dtypes, flags, names). A plain
Python function stored in a data field (a schedule written as `lambda step: ...`) is moved to
the static part, since it cannot be traced. Two equal static parts give equal treedefs, so an
equal transformation never recompiles a jitted step that takes it as an argument.

Hyperparameters given as Python or NumPy numbers are kept as NumPy float32 scalars
(`np.float32`); arrays and tracers given explicitly become JAX float32 arrays. Both are pytree
leaves, so:

- passed as an argument of a jitted function, a transformation's hyperparameters are traced:
  a new learning rate reuses the compiled program, and `jax.vmap` over stacked
  transformations sweeps them. Each call copies the scalars to the device;
  `jax.tree.map(jnp.asarray, tx)` keeps them there instead;
- held as *static* structure, as Flax NNX's `nnx.Optimizer` holds its `tx`, a transformation
  counts as no data (NNX treats `np.generic` as static, JAX and NumPy arrays as data). The
  cost: there the values are constants of the compiled step, so a new learning rate means a
  new transformation and `nnx.jit` traces the step again. To change a value without
  recompiling, wrap the transformation in `gradtx.inject_hyperparams`, which keeps the values
  in the optimizer state (data).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, TypeGuard

import jax
import jax.numpy as jnp
import numpy as np
from jax.core import Tracer
from typing_extensions import Self, dataclass_transform


def field(*, static: bool = False, converter: Callable | None = None, **kwargs: Any) -> Any:
    """A dataclass field of a `Module`, optionally static, with `converter(value, name)`."""
    return dataclasses.field(metadata={"static": static, "converter": converter}, **kwargs)


def static(default: Any = dataclasses.MISSING, converter: Callable | None = None) -> Any:
    """A static (treedef) field: structure, never traced."""
    return field(static=True, default=default, converter=converter)


def _is_static_callable(value: Any) -> bool:
    """A callable that is a pytree leaf (a plain function) cannot be traced: keep it static."""
    if not callable(value) or isinstance(value, (jax.Array, np.ndarray, Module)):
        return False
    return jax.tree_util.treedef_is_leaf(jax.tree_util.tree_structure(value))


def is_schedule(value: Any) -> TypeGuard[Callable[..., Any]]:
    """A hyperparameter given as a schedule (a callable `Module`) or a function of the step."""
    return isinstance(value, Module) or callable(value)


def _is_plain_number(value: Any) -> bool:
    """A Python or NumPy number (`1e-3`, `True`, `np.float64(0.9)`), not an array."""
    return isinstance(value, (bool, int, float, complex, np.generic))


def _checked(value: Any, name: str, what: str, *, allow_bool: bool = True) -> Any:
    """`value` as a NumPy array (Python and NumPy numbers) or a JAX array, dtype checked."""
    try:
        array = np.asarray(value) if _is_plain_number(value) else jnp.asarray(value)
    except (TypeError, ValueError, OverflowError) as e:  # a string like "1e-3" raises ValueError
        raise TypeError(f"`{name}` must be {what}, got {type(value).__name__}: {value!r}") from e
    if not (jnp.issubdtype(array.dtype, jnp.number) or (allow_bool and array.dtype == np.bool_)):
        raise TypeError(f"`{name}` must be {what}, got dtype {array.dtype}")
    if jnp.issubdtype(array.dtype, jnp.complexfloating):
        raise TypeError(f"`{name}` must be real, got dtype {array.dtype}")
    return array


def as_float(value: Any, name: str = "value") -> Any:
    """Numeric hyperparameter -> float32 leaf; schedules and functions are kept as they are.

    A Python or NumPy number becomes `np.float32`, an array or a tracer a JAX float32 array
    (why: see this module's docstring). float64 inputs are narrowed on purpose:
    hyperparameters are float32 whatever the params.
    """
    if value is None or isinstance(value, Module) or _is_static_callable(value):
        return value
    what = "a number, an array, a schedule or a function of the step"
    array = _checked(value, name, what)
    if _is_plain_number(value):
        with np.errstate(over="ignore"):  # a huge number becomes inf, as jnp's cast gives
            return np.float32(array)
    return array.astype(jnp.float32)


def as_int(value: Any, name: str = "value") -> Any:
    """Step-valued argument (boundaries, step counts) -> int32 leaf.

    As in `as_float`, a Python or NumPy number becomes a NumPy scalar (`np.int32`) and an
    array or a tracer a JAX int32 array.
    """
    if value is None:
        return None
    array = _checked(value, name, "an integer number of steps", allow_bool=False)
    if _is_plain_number(value):
        info = np.iinfo(np.int32)
        if np.issubdtype(array.dtype, np.integer) and not info.min <= int(array) <= info.max:
            raise OverflowError(f"`{name}` must fit in int32, got {value!r}")
        with np.errstate(invalid="ignore"):  # a float out of range saturates, as jnp's cast
            return np.int32(np.clip(array, info.min, info.max))
    return array.astype(jnp.int32)


def _as_vector(value: Any, name: str, scalar: Callable[[Any, str], Any]) -> Any:
    """A 1-d argument: a tuple of NumPy scalars when its values are known, else an array.

    Like a number, a list or NumPy vector of numbers (a schedule's boundaries and values) is
    then static to libraries that hold the transformation as structure (Flax NNX), and each
    entry is still a leaf that JAX traces. A JAX array or a tracer stays one array.
    """
    if value is None or isinstance(value, (jax.Array, Tracer)) or _is_plain_number(value):
        return scalar(value, name)
    if isinstance(value, (list, tuple)) and any(
        isinstance(v, (jax.Array, Tracer)) for v in value
    ):  # entries computed by JAX (traced under vmap, say): one array
        return scalar(jnp.stack([jnp.asarray(v) for v in value]), name)
    entries = np.asarray(value)
    if entries.ndim != 1:
        return scalar(value, name)  # not a vector: the scalar converter says what it is
    return tuple(scalar(entry, f"{name}[{i}]") for i, entry in enumerate(entries))


def as_floats(value: Any, name: str = "value") -> Any:
    """A vector of float32 hyperparameters (see `_as_vector`)."""
    return _as_vector(value, name, as_float)


def as_ints(value: Any, name: str = "value") -> Any:
    """A vector of int32 step-valued arguments (see `_as_vector`)."""
    return _as_vector(value, name, as_int)


def decay_rate(value: float) -> str | None:
    """A rate of an exponential moving average (Adam's betas): in [0, 1)."""
    return None if 0 <= value < 1 else "must be in [0, 1) (a decay rate)"


def momentum_rate(value: float) -> str | None:
    """A momentum: in (-1, 1) (negative momentum has its uses in games)."""
    return None if -1 < value < 1 else "must be in (-1, 1) (a momentum)"


def non_negative(value: float) -> str | None:
    """An epsilon, an offset: at least 0."""
    return None if value >= 0 else "must be >= 0"


def positive(value: float) -> str | None:
    """A clipping threshold, a norm bound: at least 0, and `inf` means no bound."""
    return None if value >= 0 else "must be >= 0 (a negative bound flips the update's sign)"


def hyperparam(
    default: Any = dataclasses.MISSING,
    *,
    check: Callable[[float], str | None] | None = None,
    required: bool = False,
) -> Any:
    """A numeric hyperparameter: a float32 leaf, a schedule, or a static function.

    Stored as `as_float` converts it. A known value (a number, a NumPy array, a JAX array
    that is no tracer) is validated at construction, every entry of an array: it must be
    finite and pass `check` (a function of the value returning what is wrong, or None). A
    traced value (inside `jit` or `vmap`) cannot be checked without its value on the host,
    so it is not. The field is a scalar where the update uses it (see
    `check_scalar_hyperparams`); an array of values is for a `jax.vmap` sweep over stacked
    transformations. `required`: the value may not be None.
    """
    metadata = {"static": False, "converter": as_float, "check": check, "required": required}
    return dataclasses.field(default=default, metadata={**metadata, "hyperparam": True})


def _known_values(value: Any) -> np.ndarray | None:
    """The values of a hyperparameter known without tracing, as a NumPy array, else None."""
    if isinstance(value, (np.generic, np.ndarray)):
        return np.asarray(value)
    if isinstance(value, Tracer) or not isinstance(value, jax.Array):
        return None  # a tracer, a schedule, a function
    if not value.is_fully_addressable:
        return None  # spread over processes: no one host holds it
    return np.asarray(value)


def check_hyperparam(
    owner: str,
    name: str,
    value: Any,
    check: Callable[[float], str | None] | None,
    given: Any = None,
) -> None:
    """Raise if a known `value` (every entry of an array) is not finite or fails `check`.

    Traced values, schedules and functions are not checked: their values are not known here.
    The message shows `given` (what the user passed) when given, else `value`.
    """
    known = _known_values(value)
    if known is None:
        return
    for entry in known.reshape(-1):
        number = float(entry)
        allows_inf = number == np.inf and check is positive
        problem = None if np.isfinite(number) or allows_inf else "must be finite"
        if problem is None and check is not None:
            problem = check(number)
        if problem is not None:
            shown = repr(value if given is None else given)
            shown += "" if known.ndim == 0 else f" (an entry is {number:g})"
            raise ValueError(f"{owner}: `{name}` {problem}, got {shown}.")


def _validate(owner: str, name: str, value: Any, given: Any, f: dataclasses.Field) -> None:
    """Raise if a hyperparameter is None where required, or out of range (see `hyperparam`)."""
    if value is None:
        if f.metadata.get("required"):
            raise TypeError(
                f"{owner}: `{name}` must be a number, an array or a schedule, got None."
            )
        return
    check_hyperparam(owner, name, value, f.metadata.get("check"), given)


def check_scalar_hyperparams(tx: Any, owner: str) -> None:
    """Raise if a numeric `hyperparam()` field of `tx`, or of a module inside it, is no scalar.

    Called where the update reads the fields, at trace time: there the shapes are known and
    no value is read. A stacked transformation's fields are arrays only outside `jax.vmap`;
    inside it they are scalars. Vector fields by design (a schedule's boundaries and values,
    Muon's coefficients) are no `hyperparam()` fields and are not looked at.
    """
    for where, holder, shape in _non_scalar_hyperparams(tx, ""):
        raise ValueError(
            f"{owner}: the hyperparameter `{where}` (of {holder}) has shape {shape}, but the "
            "update needs a scalar: an array would broadcast against each parameter's last axis. "
            "To sweep values, `jax.vmap` over transformations built from each value "
            "(`jax.vmap(lambda lr: gradtx.sgd(lr))(jnp.array([0.1, 0.01]))`); for a value per "
            "group of parameters, use `gradtx.partition`."
        )


def _non_scalar_hyperparams(obj: Module, where: str) -> list[tuple[str, str, tuple]]:
    """`(path, owner, shape)` of each non-scalar numeric hyperparameter under `obj`.

    The path is the field's attribute path from the outermost module (`transforms[0].b1`),
    the owner the name of the module holding it.
    """
    found = []
    for f in dataclasses.fields(obj):
        if f.metadata.get("static"):
            continue
        value = obj.__dict__[f.name]
        if f.metadata.get("hyperparam") and isinstance(value, (jax.Array, np.ndarray)):
            if value.shape != ():
                holder = getattr(type(obj), "name", None)
                holder = holder if isinstance(holder, str) else type(obj).__name__
                found.append((f"{where}{f.name}", holder, tuple(value.shape)))
            continue
        inner = jax.tree_util.tree_flatten_with_path(
            value, is_leaf=lambda x: isinstance(x, Module)
        )[0]
        for key_path, sub in inner:
            if isinstance(sub, Module):
                here = f"{where}{f.name}{jax.tree_util.keystr(key_path)}."
                found.extend(_non_scalar_hyperparams(sub, here))
    return found


def _format_value(value: Any) -> str:
    if isinstance(value, (jax.Array, np.ndarray, np.generic)) and not isinstance(value, Tracer):
        if value.shape == ():
            item = value.item()
            return f"{item:g}" if isinstance(item, float) else repr(item)
        return f"{value.dtype}{list(value.shape)}"
    if callable(value) and hasattr(value, "__qualname__") and not isinstance(value, Module):
        return value.__qualname__
    return repr(value)


# No field specifiers: `static` and `hyperparam` take their default positionally, which a
# checker does not read, so every field reads as optional there (the constructor still raises).
@dataclass_transform(eq_default=False, frozen_default=True)
class Module:
    """Base class: a frozen dataclass registered as a pytree with attribute keys.

    Subclasses declare fields with annotations. `static(...)` marks structure; `hyperparam()`
    converts numbers to float32 leaves. Converters run at construction (never when JAX
    rebuilds the object from leaves). Override `__check__` to validate arguments.

    How hyperparameters are stored, and what that means under `jit` and in Flax NNX: see this
    module's docstring.

    Examples:
        >>> class Scale(Module):
        ...     factor: Any = hyperparam()
        >>> jax.tree_util.tree_leaves(Scale(2.0))
        [np.float32(2.0)]
        >>> jax.tree_util.tree_leaves(Scale(jnp.asarray(2.0)))
        [Array(2., dtype=float32)]
    """

    # Set on each subclass by `dataclasses.dataclass` (in `__init_subclass__`).
    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(frozen=True, eq=False, repr=False)(cls)
        fields = dataclasses.fields(cls)
        cls._static_names = tuple(f.name for f in fields if f.metadata.get("static"))
        cls._data_names = tuple(f.name for f in fields if not f.metadata.get("static"))
        jax.tree_util.register_pytree_with_keys(
            cls, _flatten_with_keys, _make_unflatten(cls), _split
        )

    def __post_init__(self) -> None:
        owner = getattr(type(self), "name", None)
        owner = owner if isinstance(owner, str) else type(self).__name__
        for f in dataclasses.fields(self):
            convert = f.metadata.get("converter")
            if convert is not None:
                value = getattr(self, f.name)
                converted = convert(value, f"{type(self).__name__}.{f.name}")
                if f.metadata.get("hyperparam"):
                    _validate(owner, f.name, converted, value, f)
                object.__setattr__(self, f.name, converted)
        self.__check__()

    def __check__(self) -> None:
        """Validate constructor arguments (override); raise with the argument's name."""

    def replace(self, **changes: Any) -> Self:
        """A copy with some fields replaced (converters run again)."""
        return dataclasses.replace(self, **changes)

    def __repr__(self) -> str:
        parts = []
        for f in dataclasses.fields(self):
            if f.repr:
                parts.append(f"{f.name}={_format_value(getattr(self, f.name))}")
        return f"{type(self).__name__}({', '.join(parts)})"


def _split(obj: Module) -> tuple[list, tuple]:
    children, child_names, static_data = [], [], []
    for name in obj._data_names:
        value = obj.__dict__[name]
        if _is_static_callable(value):
            static_data.append((name, value))
        else:
            child_names.append(name)
            children.append(value)
    statics = tuple((name, obj.__dict__[name]) for name in obj._static_names)
    return children, (tuple(child_names), tuple(static_data) + statics)


def _flatten_with_keys(obj: Module) -> tuple[list, tuple]:
    children, aux = _split(obj)
    keyed = [(jax.tree_util.GetAttrKey(n), c) for n, c in zip(aux[0], children)]
    return keyed, aux


def _make_unflatten(cls: type) -> Callable:
    def unflatten(aux: tuple, children: Any) -> Module:
        obj = object.__new__(cls)
        child_names, statics = aux
        for name, value in zip(child_names, children):
            object.__setattr__(obj, name, value)
        for name, value in statics:
            object.__setattr__(obj, name, value)
        return obj

    return unflatten
