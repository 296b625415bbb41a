"""Selectors: one vocabulary to pick leaves by path, used by every `mask=`, `where=` and label.

Forms, resolved in this order and never guessed:

1. a glob string or a list/tuple of glob strings: `*` matches within one path segment, `**`
   across segments, a leading `!` excludes (`"**/bias"`, `["**/kernel", "!head/**"]`). A glob
   selects the leaves it matches and every leaf below a subtree it matches, so `"enc"` selects
   all of `enc/...`;
2. a compiled regular expression, matched in full against the path (`re.compile(r".*/w")`);
3. a pytree of bools shaped like the params, or a prefix of them (`{"enc": True, "dec": False}`),
   used as data and never called, even when it is a callable (Equinox) module;
4. a function: `f(path, leaf) -> bool` if it takes two arguments, `f(params) -> pytree of bools`
   (optax style) if it takes one.

A selector that matches nothing is an error in strict mode: it is almost always a typo. So is
each glob of it, an excluding one included, that matches no path. These checks read every path
of the tree, its `None` leaves too: in the tree a combinator hands one group, the other groups'
paths are `None`, and a mask written for the whole model is no typo there.

Labels (`resolve_labels`) take the same forms by the same rule: `{label: selector}`, a tree of
labels, `f(path, leaf) -> label` or an optax-style `f(params) -> tree of labels`.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import inspect
import re
from collections.abc import Callable, Hashable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

from gradtx._paths.cache import BoundedCache, bounded_lru_cache
from gradtx._paths.paths import flatten, is_unit, virtual


class SelectorError(ValueError):
    """A selector is malformed, matches nothing, or does not fit the tree."""


class LabelError(ValueError):
    """A leaf has no label, two labels, or a label with no transformation."""


@dataclasses.dataclass(frozen=True)
class Selector:
    """A selector in normal form: hashable, so it can live in a transformation's static part.

    Build one with `as_selector`; every API taking a selector accepts the raw forms too.
    """

    kind: str  # "glob" | "regex" | "bools" | "path_fn" | "tree_fn"
    value: Any

    def __repr__(self) -> str:
        if self.kind == "glob":
            return repr(self.value[0] if len(self.value) == 1 else list(self.value))
        if self.kind == "regex":
            return f"re.compile({self.value.pattern!r})"
        if self.kind == "bools":
            return f"<bool tree of {len(self.value)} paths>"
        return getattr(self.value, "__qualname__", repr(self.value))


def _is_bool(x: Any) -> bool:
    if isinstance(x, (bool, np.bool_)):
        return True
    return isinstance(x, (np.ndarray, jax.Array)) and x.shape == () and x.dtype == np.bool_


def _bool_items(tree: Any) -> tuple[tuple[str, bool], ...] | None:
    """`((path, bool), ...)` if `tree` is a non-empty pytree of bools, else None."""
    if isinstance(tree, (str, re.Pattern)):
        return None
    try:
        paths_, leaves_, _ = flatten(tree)
    except Exception:
        return None
    items = [(p, x) for p, x in zip(paths_, leaves_) if x is not None]
    if not items or not all(_is_bool(x) for _, x in items):
        return None
    if any(isinstance(x, Tracer) for _, x in items):
        raise SelectorError("A bool-tree selector must hold concrete bools, not traced values.")
    return tuple((p, bool(x)) for p, x in items)


def _positional_arity(fn: Callable) -> int | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    required = [
        p
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    return len(required)


def as_selector(selector: Any, argument: str = "selector") -> Selector:
    """Normalise any selector form into a hashable `Selector` (see the module docstring).

    Args:
        selector: a glob, list of globs, regex, bool pytree, or function.
        argument: the argument's name, used in error messages.

    Examples:
        >>> as_selector(["**/kernel", "!head/**"])
        ['**/kernel', '!head/**']
    """
    if isinstance(selector, Selector):
        return selector
    globs = (selector,) if isinstance(selector, str) else selector
    if isinstance(globs, (list, tuple)) and globs and all(isinstance(g, str) for g in globs):
        return Selector("glob", tuple(globs))
    if isinstance(selector, re.Pattern):
        return Selector("regex", selector)
    items = _bool_items(selector)
    if items is not None:
        return Selector("bools", items)
    if callable(selector):
        arity = _positional_arity(selector)
        if arity == 2:
            return Selector("path_fn", selector)
        if arity == 1:
            return Selector("tree_fn", selector)
        raise SelectorError(
            f"`{argument}`: a selector function must take `(path, leaf)` or `(params)`, "
            f"but {getattr(selector, '__qualname__', selector)!r} takes {arity} arguments."
        )
    raise SelectorError(
        f"`{argument}`: cannot use {type(selector).__name__} {selector!r} as a selector. "
        "Use a glob ('**/bias'), a list of globs, a compiled regex, a pytree of bools, or a "
        "function f(path, leaf) -> bool."
    )


@bounded_lru_cache(4096)
def _glob_pattern(glob: str) -> tuple[re.Pattern | None, ...]:
    """Each segment of `glob` as a compiled pattern, `None` for `**`."""
    return tuple(
        None if seg == "**" else re.compile(fnmatch.translate(seg)) for seg in glob.split("/")
    )


@bounded_lru_cache(65536)
def _glob_matches(glob: str, path: str) -> bool:
    """True if `glob` matches `path` or one of its ancestors (whole segments)."""
    segments = path.split("/")
    # The positions in `segments` where the pattern read so far can have stopped: a `**`
    # reaches every later one, a segment pattern moves each on by the segment it matches.
    # Sets of positions, not a memoised recursion: each path is matched once per glob, and
    # building a memoised function for it cost more than the match (benchmarks/compile_time.py).
    reached = {0}
    for segment in _glob_pattern(glob):
        if segment is None:
            reached = set(range(min(reached), len(segments) + 1))
        else:
            reached = {j + 1 for j in reached if j < len(segments) and segment.match(segments[j])}
            if not reached:
                return False
    return True  # the whole pattern matched: the path is this subtree's root or lies under it


def _is_prefix(prefix: str, path: str) -> bool:
    return prefix == "" or path == prefix or path.startswith(prefix + "/")


def _sample(paths_: Sequence[Any], n: int = 8) -> str:
    shown = ", ".join(repr(p) for p in paths_[:n])
    return shown + (f", ... ({len(paths_)} in all)" if len(paths_) > n else "")


def _deepest(items: Any, path: str) -> tuple[str, Any] | None:
    """The `(prefix, value)` of `items` with the longest prefix of `path`, if any.

    The deepest entry wins: `{"enc": False, "enc/w": True}` selects only `enc/w`.
    """
    owners = [(p, x) for p, x in items if _is_prefix(p, path)]
    return max(owners, key=lambda px: len(px[0]), default=None)


def _stray(items: Any, all_paths: tuple[str, ...]) -> tuple[str, Any] | None:
    """The first `(prefix, value)` of `items` over none of `all_paths`, if any."""
    return next(((p, x) for p, x in items if not any(_is_prefix(p, q) for q in all_paths)), None)


def _from_bools(
    items: tuple[tuple[str, bool], ...],
    tree_paths: list[str],
    all_paths: tuple[str, ...],
    strict: bool,
    argument: str,
) -> tuple[set[str], bool]:
    """`(selected present paths, whether it selects any path of the tree, absent ones too)`."""
    present = set(tree_paths)
    chosen, anywhere = set(), False
    for path in all_paths:
        owner = _deepest(items, path)
        if owner is None and path in present:
            raise SelectorError(
                f"`{argument}`: the bool tree has no entry for path {path!r}. A bool-tree "
                "selector must have the params' structure (or a prefix of it). "
                f"Its paths are: {_sample([p for p, _ in items])}."
            )
        if owner is not None and owner[1]:  # an absent path (another group's) may have none
            anywhere = True
            if path in present:
                chosen.add(path)
    stray = _stray(items, all_paths) if strict else None
    if stray is not None:
        raise SelectorError(
            f"`{argument}`: the bool tree has path {stray[0]!r}, which is not in the tree. "
            f"The tree's paths are: {_sample(all_paths)}."
        )
    return chosen, anywhere


# Glob and regex selections depend only on the paths, so each is made once per set of paths
# (every trace of a step selects again, and matching globs on many paths is not free).
_BY_PATHS: BoundedCache = BoundedCache(256)


def _select_set(
    tree: Any, flat: tuple, sel: Selector, strict: bool, argument: str
) -> tuple[AbstractSet[str], bool | None]:
    """`(the selected present paths, whether the selector picks any path of the tree)`.

    The second is `None` where it cannot be known: a function selector is never called on an
    absent (`None`) leaf.
    """
    # `all_paths` holds the absent (`None`) leaves too: in a group's tree, the paths of the
    # other groups. Globs, regexes and bool trees are checked against all of them, so a mask
    # written for the whole model is no typo inside one group; selection is among `present`.
    all_paths, leaves_ = flat
    present = [(p, x) for p, x in zip(all_paths, leaves_) if x is not None]
    tree_paths = [p for p, _ in present]
    if sel.kind in ("glob", "regex"):
        key = (sel, all_paths, tuple(tree_paths), strict)
        kept = _BY_PATHS.get(key)
        if kept is None:
            picked = _by_pattern(sel, all_paths, strict, argument)
            kept = _BY_PATHS.remember(
                key, (frozenset(picked.intersection(tree_paths)), bool(picked))
            )
        return kept
    if sel.kind == "bools":
        return _from_bools(sel.value, tree_paths, all_paths, strict, argument)
    unknown = None if len(tree_paths) < len(all_paths) else False
    if sel.kind == "path_fn":
        chosen = set()
        for p, x in present:
            verdict = sel.value(p, x)
            if not _is_bool(verdict) or isinstance(verdict, Tracer):
                raise SelectorError(
                    f"`{argument}`: the selector function returned {verdict!r} for path {p!r}; "
                    "it must return a Python bool decided from the path, shape or dtype "
                    "(not from array values)."
                )
            if verdict:
                chosen.add(p)
        return chosen, (True if chosen else unknown)
    # tree_fn: optax style, f(params) -> pytree of bools
    result = sel.value(tree)
    items = _bool_items(result)
    if items is None:
        raise SelectorError(
            f"`{argument}`: the selector function {sel!r} takes one argument, so it is called "
            "as f(params) and must return a pytree of bools shaped like the params; it "
            f"returned {type(result).__name__}. For a per-leaf test, write f(path, leaf)."
        )
    chosen, anywhere = _from_bools(items, tree_paths, all_paths, strict, argument)
    return chosen, (True if anywhere else unknown)


def _by_pattern(sel: Selector, all_paths: tuple[str, ...], strict: bool, argument: str) -> set:
    """The paths a glob or regex selector picks among `all_paths` (absent ones included)."""
    if sel.kind == "regex":
        return {p for p in all_paths if sel.value.fullmatch(p)}
    # Every glob, including or excluding, must match a path: one that does not is a typo.
    for g in sel.value:
        bare = g[1:] if g.startswith("!") else g
        if strict and not any(_glob_matches(bare, p) for p in all_paths):
            what = f"excludes nothing: {bare!r} matches no path" if g != bare else "matches no path"
            raise SelectorError(
                f"`{argument}`: the glob {g!r} {what}. The tree's paths are: {_sample(all_paths)}."
            )
    includes = [g for g in sel.value if not g.startswith("!")]
    excludes = [g[1:] for g in sel.value if g.startswith("!")]
    return {
        p
        for p in all_paths
        if (not includes or any(_glob_matches(g, p) for g in includes))
        and not any(_glob_matches(g, p) for g in excludes)
    }


def select(
    tree: Any, selector: Any, *, strict: bool = True, argument: str = "selector"
) -> list[str]:
    """The paths of `tree` that `selector` picks, in tree order (`None` leaves are skipped).

    The checks of `strict` read every path of `tree`, its `None` leaves included: in the tree a
    combinator hands one group (`partition`, `masked`, `freeze`), the other groups' paths are
    `None`, so a mask written for the whole model (a bool tree, a glob) may select only other
    groups' paths there, or none of them, and is still no typo.

    Args:
        tree: any pytree (dicts, lists, dataclasses, Equinox modules, ...), including a
            state gradtx built (per-path step counts, packed and bucketed slots read by the
            paths they hold: `count/enc/w`).
        selector: a glob, list of globs, compiled regex, bool pytree, or function (see
            `gradtx.paths`).
        strict: raise `SelectorError` when the selector picks no path of the tree, when a
            glob, including or excluding (`"!**/bias"`), matches no path, or when a bool tree
            has paths the tree lacks.
        argument: the argument's name, used in error messages.

    Examples:
        >>> params = {"enc": {"w": 1.0, "b": 0.0}, "head": {"w": 1.0}}
        >>> select(params, ["**/w", "!head"])
        ['enc/w']
        >>> select({"enc": {"w": 1.0, "b": None}}, "**/b")  # absent here, yet no typo
        []
    """
    sel = as_selector(selector, argument)
    paths_, leaves_, _ = flatten(tree)
    if any(is_unit(x) for x in leaves_):  # units are selected by the paths they hold
        tree = virtual(tree)
        paths_, leaves_, _ = flatten(tree)
    chosen, anywhere = _select_set(tree, (paths_, leaves_), sel, strict, argument)
    if strict and anywhere is False:
        raise SelectorError(
            f"`{argument}`: the selector {sel!r} matches no path. The tree's paths are: "
            f"{_sample(paths_)}. "
            + (
                "Pass strict=False if an empty selection is intended."
                if argument == "selector"  # `select` itself; a combinator takes no `strict`
                else "If no parameter should be selected, leave the transformation out."
            )
        )
    return [p for p in paths_ if p in chosen]


def resolve_labels(
    tree: Any,
    labels: Any,
    known: tuple[Hashable, ...] | None = None,
    argument: str = "labels",
    *,
    strict: bool = True,
) -> dict[str, Hashable]:
    """Give every non-`None` leaf of `tree` exactly one label.

    Labels follow the selector rule: a function taking two arguments is called as
    `f(path, leaf)` for each leaf and returns its label; one taking one argument is called
    optax-style as `f(params)` and returns a tree of labels. A dict is read as
    `{label: selector}` or as a tree of labels shaped like the params, whichever reading is
    valid; a dict valid under both readings that label some path differently raises, showing
    both. As for selectors, the `None` leaves of `tree` (another group's paths, in a group)
    count as paths of the tree for the checks, but get no label.

    Args:
        tree: the params (or updates) tree.
        labels: `{label: selector}`; a function `f(path, leaf) -> label` or
            `f(params) -> tree of labels`; or a pytree of labels shaped like `tree` (or a
            prefix of it), used as data even when it is callable (an Equinox module).
        known: the valid labels; a label outside it is an error naming the path.
        argument: the argument's name, used in error messages.
        strict: a `{label: selector}` selector, or a label tree's entry, that matches no path
            raises (see `select`).

    Returns:
        `{path: label}` in tree order.

    Examples:
        >>> resolve_labels({"enc": {"w": 1.0}, "dec": {"w": 2.0}}, {"a": "enc", "b": "dec"})
        {'dec/w': 'b', 'enc/w': 'a'}
        >>> resolve_labels({"enc": {"w": 1.0}, "dec": {"w": 2.0}}, {"enc": "a", "dec": "b"})
        {'dec/w': 'b', 'enc/w': 'a'}
        >>> resolve_labels({"w": 1.0, "b": 2.0}, lambda path, leaf: path.upper())
        {'b': 'B', 'w': 'W'}
    """
    tree = virtual(tree)
    paths_, leaves_, _ = flatten(tree)
    tree_paths = [p for p, x in zip(paths_, leaves_) if x is not None]
    if isinstance(labels, Mapping):
        out = _labels_from_dict(tree, labels, paths_, tree_paths, known, argument, strict)
    elif callable(labels) and not _is_label_tree(labels):
        out = _labels_from_function(tree, labels, paths_, tree_paths, argument, strict)
    else:
        out = _labels_from_tree(labels, paths_, tree_paths, argument, strict=strict)
    _check_known(out, known, argument)
    return out


def _check_known(out: dict[str, Hashable], known: tuple | None, argument: str) -> None:
    if known is None:
        return
    for p, label in out.items():
        if label not in known:
            raise LabelError(
                f"`{argument}`: path {p!r} has label {label!r}, which has no "
                f"transformation; the labels are {list(known)}."
            )


def _is_label_tree(obj: Any) -> bool:
    leaves_ = jax.tree_util.tree_leaves(obj)
    return bool(leaves_) and all(isinstance(x, (str, int)) for x in leaves_)


def _labels_by_selector(
    tree: Any, labels: Mapping, tree_paths: list[str], argument: str, strict: bool
) -> dict[str, Hashable]:
    owners: dict[str, list] = {p: [] for p in tree_paths}
    for label, selector in labels.items():
        for p in select(tree, selector, strict=strict, argument=f"{argument}[{label!r}]"):
            owners[p].append(label)
    out = {}
    for p in tree_paths:
        if not owners[p]:
            raise LabelError(f"`{argument}`: path {p!r} has no label; every leaf needs one.")
        if len(owners[p]) > 1:
            raise LabelError(
                f"`{argument}`: path {p!r} has several labels {owners[p]}; every leaf "
                "needs exactly one (narrow one of the selectors, e.g. with '!')."
            )
        out[p] = owners[p][0]
    return out


def _labels_from_dict(
    tree: Any,
    labels: Mapping,
    all_paths: tuple[str, ...],
    tree_paths: list[str],
    known: tuple | None,
    argument: str,
    strict: bool,
) -> dict[str, Hashable]:
    """A dict read as `{label: selector}` or as a tree of labels: the reading that is valid.

    Neither is a guess: a dict valid under one reading only means that reading, and one valid
    under both with different labels raises, showing both.
    """
    if known is not None and not set(labels) <= set(known):
        _check_label_tree_reading(labels, known, argument)  # its keys are no labels
        return _labels_from_tree(labels, all_paths, tree_paths, argument, strict=strict)
    if not _is_label_tree(labels):
        return _labels_by_selector(tree, labels, tree_paths, argument, strict)

    def attempt(read: Callable[[], dict]) -> tuple[dict | None, Exception | None]:
        try:
            out = read()
            _check_known(out, known, argument)
            return out, None
        except (SelectorError, LabelError) as error:
            return None, error

    by_selector, selector_error = attempt(
        lambda: _labels_by_selector(tree, labels, tree_paths, argument, strict)
    )
    by_tree, tree_error = attempt(
        lambda: _labels_from_tree(labels, all_paths, tree_paths, argument, strict=strict)
    )
    if by_selector is not None and by_tree is not None and by_selector != by_tree:
        differ = [p for p in tree_paths if by_selector[p] != by_tree[p]]
        raise LabelError(
            f"`{argument}` reads two ways with different labels. As `{{label: selector}}`: "
            f"{_shown_labels(by_selector, differ)}. As a tree of labels shaped like the "
            f"params: {_shown_labels(by_tree, differ)}. For the tree of labels pass "
            "`lambda params: labels`; for `{label: selector}` write selectors that are no "
            "labels (a glob such as 'enc/**')."
        )
    if by_selector is not None:
        return by_selector
    if by_tree is not None:
        return by_tree
    if known is None:
        raise selector_error  # type: ignore[misc]
    raise LabelError(
        f"`{argument}` reads neither way. As `{{label: selector}}`: {selector_error} As a "
        f"tree of labels shaped like the params: {tree_error}"
    )


def _shown_labels(by_path: dict[str, Hashable], differ: list[str], n: int = 6) -> str:
    shown = ", ".join(f"{p!r} -> {by_path[p]!r}" for p in differ[:n])
    return shown + (f", ... ({len(differ)} paths differ)" if len(differ) > n else "")


def _labels_from_function(
    tree: Any,
    labels: Callable,
    all_paths: tuple[str, ...],
    tree_paths: list[str],
    argument: str,
    strict: bool,
) -> dict[str, Hashable]:
    arity = _positional_arity(labels)
    name = getattr(labels, "__qualname__", labels)
    if arity == 1:  # optax style: f(params) -> a tree of labels
        result = labels(tree)
        if not _is_label_tree(result):
            raise LabelError(
                f"`{argument}`: the label function {name!r} takes one argument, so it is "
                "called as f(params) and must return a pytree of labels (str or int) shaped "
                f"like the params; it returned {type(result).__name__}. For a label per "
                "leaf, write f(path, leaf) -> label."
            )
        return _labels_from_tree(result, all_paths, tree_paths, argument, strict=strict)
    if arity != 2:
        raise LabelError(
            f"`{argument}`: a label function must take `(path, leaf)` or `(params)`, but "
            f"{name!r} takes {arity} arguments."
        )
    out: dict[str, Hashable] = {}
    for p, x in zip(*flatten(tree)[:2]):
        if x is None:
            continue
        out[p] = labels(p, x)
        if not isinstance(out[p], (str, int)):
            raise LabelError(
                f"`{argument}`: the label function {name!r} takes two arguments, so it is "
                f"called as f(path, leaf) and must return a str or int; for path {p!r} it "
                f"returned {type(out[p]).__name__}. For an optax-style f(params) -> tree of "
                "labels, take one argument."
            )
    return out


def _check_label_tree_reading(labels: Mapping, known: tuple, argument: str) -> None:
    """A dict whose keys are not all labels is a tree of labels only if its values are labels.

    Otherwise it reads neither way (most often a `{label: selector}` dict with a label that has
    no transformation): raise, showing both readings.
    """
    values = [x for x in jax.tree_util.tree_leaves(labels) if x is not None]
    if values and all(isinstance(x, Hashable) and x in known for x in values):
        return
    unknown = [k for k in labels if k not in known]
    not_labels = [x for x in values if not (isinstance(x, Hashable) and x in known)]
    raise LabelError(
        f"`{argument}` is a dict that reads neither way. As `{{label: selector}}`, its keys "
        f"{unknown} have no transformation (the transformations are {list(known)}). As a tree "
        f"of labels shaped like the params, its values {_sample(not_labels)} are not labels. "
        "Give each label a transformation, or each parameter path a label."
    )


def _labels_from_tree(
    labels: Any,
    all_paths: tuple[str, ...],
    tree_paths: list[str],
    argument: str,
    *,
    strict: bool = True,
) -> dict[str, Hashable]:
    items = [(p, x) for p, x in zip(*flatten(labels)[:2]) if x is not None]
    stray = _stray(items, all_paths) if strict else None
    if stray is not None:
        raise LabelError(
            f"`{argument}`: the label tree's entry {stray[0]!r} (label {stray[1]!r}) matches no "
            f"parameter; the params' paths are {_sample(all_paths)}."
        )
    out = {}
    for path in tree_paths:
        owner = _deepest(items, path)
        if owner is None:
            raise LabelError(
                f"`{argument}`: path {path!r} has no label in the label tree; its paths are "
                f"{_sample([p for p, _ in items])}."
            )
        out[path] = owner[1]
    return out
