"""A transformation's fingerprint: its structure and static settings, described and hashed.

Checkpoints store both, so that restoring into another optimizer (another chain, mask, flag
or state dtype) is noticed and the difference is named by its place in the chain. Numeric
hyperparameters are array leaves of the transformation and are left out, so a new learning
rate keeps the fingerprint, as it keeps the compiled step. So is the storage layout of
`bucketed`: its state keys, and so its checkpoints, are those of the transformation inside.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import jax

from gradtx._combinators.bucketed import Bucketed
from gradtx._core.module import Module
from gradtx._paths.selectors import Selector

# Default reprs carry memory addresses (`<function f at 0x7f...>`), which differ between runs.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
# A leaf of the transformation: a numeric hyperparameter, whose value is not structure.
LEAF = "*"
# Longer settings (a mask given as a tree of bools) are kept short in the file's header.
_LONGEST = 160
_CONTAINERS = (tuple, list, dict)


def fingerprint(tx: Any) -> str:
    """`"sha256:<hex>"` of `describe(tx)`: equal for transformations of equal structure.

    Only class names go in, not their modules, so moving a class inside gradtx keeps the
    fingerprints of saved checkpoints.

    Args:
        tx: any transformation (or pytree).

    Returns:
        The hash, as `"sha256:"` and 64 hex digits.

    Examples:
        >>> fingerprint(gradtx.adam(1e-3)) == fingerprint(gradtx.adam(1e-2))
        True
        >>> fingerprint(gradtx.adam(1e-3)) == fingerprint(gradtx.adam(1e-3, nesterov=True))
        False
    """
    return hash_description(describe(tx))


def hash_description(description: Any) -> str:
    """The fingerprint of a `describe` result, as stored beside it in a checkpoint's header.

    Args:
        description: what `describe` returned (or its JSON read back).

    Returns:
        `"sha256:"` and 64 hex digits.

    Examples:
        >>> hash_description(describe(gradtx.sgd(0.1))) == fingerprint(gradtx.sgd(0.1))
        True
    """
    text = json.dumps(description, separators=(",", ":"), ensure_ascii=True)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def describe(tx: Any) -> Any:
    """`tx`'s structure as JSON-ready data, small enough for a file's header.

    A node is `{"type": class name, "name": its name in a path, "settings": {field: text},
    "children": [[name, node], ...]}`; a leaf (a numeric hyperparameter) is `"*"`. Children
    are named as in `state_dict` keys where a chain names its steps (`chain/adamw`), by dict
    key or field name elsewhere, and by position in a tuple or list. A `bucketed`
    transformation is described as the one inside it.

    Args:
        tx: any transformation (or pytree).

    Returns:
        The description (nested dicts, lists and strings).

    Examples:
        >>> describe(gradtx.scale(2.0))
        {'type': 'Scale', 'name': 'scale', 'settings': {}, 'children': [['step_size', '*']]}
    """
    return _node(jax.tree_util.tree_structure(tx))


def _node(treedef: Any) -> Any:
    # A walk of the treedef rather than `str(treedef)`, whose layout may change between JAX
    # versions.
    children = treedef.children()
    if not children and treedef.num_leaves == 1:
        return LEAF
    kind, data = treedef.node_data()
    if kind is Bucketed:  # a storage layout: the same state keys as its inner transformation
        return _node(children[0])
    name = kind.__qualname__
    if not (isinstance(kind, type) and issubclass(kind, Module)):
        settings = {} if kind in (tuple, list, dict, type(None)) else {"data": _short(_text(data))}
        named = _container_children(treedef)
        return {"type": kind.__qualname__, "name": name, "settings": settings, "children": named}
    fields, statics = data
    settings = {field: _short(_text(value)) for field, value in statics}
    named = list(zip(fields, children))
    if len(named) == 1 and _is_container(named[0][1]):
        # The steps of a chain or the groups of a partition, by the names their states get.
        names = dict(statics).get("names")
        named = _container_children(named[0][1])
        if isinstance(names, tuple) and len(names) == len(named):
            settings.pop("names")
            named = [[str(n), c] for n, (_, c) in zip(names, named)]
    else:
        named = [[field, _node(c)] for field, c in named]
    label, class_name = dict(statics).get("label"), getattr(kind, "name", None)
    if isinstance(label, str) and label:
        name = label
    elif isinstance(class_name, str):
        name = class_name
    return {"type": kind.__qualname__, "name": name, "settings": settings, "children": named}


def _is_container(treedef: Any) -> bool:
    return bool(treedef.children()) and treedef.node_data()[0] in _CONTAINERS


def _container_children(treedef: Any) -> list:
    children = treedef.children()
    kind, data = treedef.node_data()
    keys = list(data) if kind is dict else range(len(children))
    return [[str(k), _node(c)] for k, c in zip(keys, children)]


def _text(value: Any) -> str:
    """A repr that is the same in every process: no addresses, and sets sorted."""
    if isinstance(value, Selector) and value.kind == "bools":  # its repr gives only a count
        chosen = [path for path, on in value.value if on]
        return f"<bool tree selecting {chosen} of {len(value.value)} paths>"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(_text(v) for v in value)) + "}"
    if type(value) is tuple:
        inner = ", ".join(_text(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if type(value) is list:
        return "[" + ", ".join(_text(v) for v in value) + "]"
    if type(value) is dict:
        return "{" + ", ".join(f"{_text(k)}: {_text(v)}" for k, v in value.items()) + "}"
    return _ADDRESS.sub("", repr(value))


def _short(text: str) -> str:
    if len(text) <= _LONGEST:
        return text
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return f"{text[: _LONGEST // 2]}... ({len(text)} characters, sha256 {digest})"


def diff(saved: Any, current: Any) -> list[str]:
    """What differs between two `describe` results, one line per difference, by path.

    Lines read `chain/adamw/add_decayed_weights: mask 'a' -> '**/w'` (a setting),
    `chain/0: adam -> lion` (another step in that place) or `chain: steps [...] -> [...]`.

    Args:
        saved: the description stored with a checkpoint.
        current: the description of the transformation it is restored into.

    Returns:
        The lines, empty if the descriptions are equal.

    Examples:
        >>> diff(describe(gradtx.adam(1e-3)), describe(gradtx.adam(1e-3, nesterov=True)))
        ['adam/scale_by_adam: nesterov False -> True']
    """
    out: list[str] = []
    root = current["name"] if isinstance(current, dict) else "(root)"
    _diff(saved, current, root, out)
    return out


def _display(node: Any) -> str:
    if node == LEAF:
        return "a value"
    return node["name"] if node["name"] == node["type"] else f"{node['name']} ({node['type']})"


def _diff(old: Any, new: Any, path: str, out: list[str]) -> None:
    if old == new:
        return
    if LEAF in (old, new) or old["type"] != new["type"]:
        out.append(f"{path}: {_display(old)} -> {_display(new)}")
        return
    a, b = old["settings"], new["settings"]
    for key in {**a, **b}:  # the saved settings' order, then the new ones
        if a.get(key) != b.get(key):
            out.append(f"{path}: {key} {a.get(key, '(none)')} -> {b.get(key, '(none)')}")
    old_children, new_children = old["children"], new["children"]
    if len(old_children) == len(new_children):
        for i, ((m, x), (n, y)) in enumerate(zip(old_children, new_children)):
            if m == n:
                _diff(x, y, f"{path}/{n}", out)
            else:  # another step in this place: its insides are not comparable
                out.append(f"{path}/{i}: {m} -> {n}")
        return
    old_names, new_names = [n for n, _ in old_children], [n for n, _ in new_children]
    out.append(f"{path}: steps {old_names} -> {new_names}")
    by_name = dict(old_children)
    for n, y in new_children:
        if n in by_name:
            _diff(by_name[n], y, f"{path}/{n}", out)
