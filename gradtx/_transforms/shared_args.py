"""The arguments that many transformations and optimizers share, described once.

A function decorated with `with_shared_args` describes in its `Args:` section only the
arguments that are its own; the decorator completes the section, in the order of the
signature, from `SHARED_ARGS`, when the module is imported. `help()` and doctests see every
argument, and so does the API reference: its build takes these docstrings from the imported
functions (griffe alone reads the source).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable)

SHARED_ARGS = {
    "learning_rate": "a number or a schedule.",
    "b1": "decay of the first moment.",
    "b2": "decay of the second moment.",
    "eps": "added to the denominator outside the square root.",
    "eps_root": "added inside the square root.",
    "mu_dtype": "dtype of the first moment `mu` (default: the parameter's dtype).",
    "nu_dtype": "dtype of the second moment `nu` (default: the parameter's dtype).",
    "nesterov": "use Nesterov momentum.",
    "weight_decay": "the decoupled decay rate (multiplied by the learning rate).",
    "mask": 'selector of the paths to decay (for example `"!**/bias"`); default: all.',
    "accumulator_dtype": "dtype of the momentum buffer (default: the parameter's dtype).",
}

# The sections an `Args:` section comes before, when the docstring has none.
_LATER_SECTIONS = re.compile(r"(State|Returns|Raises|Examples|References):")


def with_shared_args(fn: F) -> F:
    """`fn` with its `Args:` section completed from `SHARED_ARGS`, one entry per argument.

    Args:
        fn: a function whose `Args:` section describes the arguments that are its own (and
            may override a shared description), each entry on lines of its own.

    Returns:
        `fn` itself, its `__doc__` describing every argument in the order of the signature.

    Raises:
        TypeError: an argument is described neither by `fn` nor in `SHARED_ARGS`, or `fn`
            describes one it does not take.
    """
    lines = inspect.cleandoc(fn.__doc__ or "").split("\n")
    own: dict[str, list[str]] = {}
    if "Args:" in lines:
        end = lines.index("Args:") + 1
        head = lines[: end - 1]
        while end < len(lines) and lines[end].startswith("    "):
            if not lines[end].startswith("     "):  # an entry, not its continuation
                own[lines[end].split(":")[0].strip()] = []
            own[list(own)[-1]].append(lines[end])
            end += 1
        tail = lines[end:]
    else:  # a new section, before the first of the later ones
        later = [i for i, line in enumerate(lines) if _LATER_SECTIONS.fullmatch(line)]
        start = later[0] if later else len(lines)
        head, tail = lines[:start], ["", *lines[start:]]
    entries = []
    for name in inspect.signature(fn).parameters:
        if name in own:
            entries += own.pop(name)
        elif name in SHARED_ARGS:
            entries.append(f"    {name}: {SHARED_ARGS[name]}")
        else:
            raise TypeError(f"{fn.__qualname__}: argument `{name}` is not described.")
    if own:
        raise TypeError(f"{fn.__qualname__} describes `{next(iter(own))}`, which it does not take.")
    fn.__doc__ = "\n".join([*head, "Args:", *entries, *tail])
    return fn
