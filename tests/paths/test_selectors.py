"""Selectors: every form of `gradtx.paths.select` and `resolve_labels`, and their errors."""

import dataclasses
import fnmatch
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradtx
from gradtx import paths as gpaths
from gradtx.paths import LabelError, SelectorError, resolve_labels, select


def _params():
    return {
        "enc": {
            "layers": [
                {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)},
                {"w": jnp.ones((2, 2)), "b": jnp.zeros(2)},
            ]
        },
        "head": {"w": jnp.ones((2, 1)), "b": jnp.zeros(1)},
        "scale": jnp.ones(()),
    }


ALL = [
    "enc/layers/0/b",
    "enc/layers/0/w",
    "enc/layers/1/b",
    "enc/layers/1/w",
    "head/b",
    "head/w",
    "scale",
]


def test_fixture_paths():
    assert gpaths.paths(_params()) == ALL


# --- globs -------------------------------------------------------------------------------------


def test_glob_star_stays_within_one_segment():
    assert select(_params(), "*/w") == ["head/w"]
    assert select(_params(), "enc/layers/*/w") == ["enc/layers/0/w", "enc/layers/1/w"]
    assert select(_params(), "sc*") == ["scale"]


def test_glob_double_star_crosses_segments():
    assert select(_params(), "**/w") == ["enc/layers/0/w", "enc/layers/1/w", "head/w"]
    assert select(_params(), "**") == ALL
    assert select(_params(), "enc/**/b") == ["enc/layers/0/b", "enc/layers/1/b"]


def test_glob_exclusion():
    assert select(_params(), ["**/w", "!head/**"]) == ["enc/layers/0/w", "enc/layers/1/w"]


def test_glob_excludes_only_selects_everything_else():
    assert select(_params(), "!**/b") == [
        "enc/layers/0/w",
        "enc/layers/1/w",
        "head/w",
        "scale",
    ]
    assert select(_params(), ["!**/b", "!enc"]) == ["head/w", "scale"]


def test_glob_list_is_a_union():
    assert select(_params(), ["head/w", "scale"]) == ["head/w", "scale"]
    assert select(_params(), ("scale", "head/w")) == ["head/w", "scale"]


def test_glob_selects_subtrees():
    assert select(_params(), "enc") == ALL[:4]
    assert select(_params(), "enc/layers/1") == ["enc/layers/1/b", "enc/layers/1/w"]
    assert select(_params(), "*/layers/0") == ["enc/layers/0/b", "enc/layers/0/w"]


def test_glob_matches_whole_segments_only():
    # "head/w" must not select "head/wide"; "enc/layers/1" must not select "enc/layers/10".
    params = {"head": {"w": 1.0, "wide": 2.0}, "layers": [float(i) for i in range(12)]}
    assert select(params, "head/w") == ["head/w"]
    assert select(params, "layers/1") == ["layers/1"]


def _reference_match(glob: str, path: str) -> bool:
    # Written from the rule, not from the library: some leading run of the path's segments
    # matches the glob whole, `**` standing for any number of segments (none included).
    def whole(pattern: list[str], segments: list[str]) -> bool:
        if not pattern:
            return not segments
        if pattern[0] == "**":
            return any(whole(pattern[1:], segments[k:]) for k in range(len(segments) + 1))
        return (
            bool(segments)
            and fnmatch.fnmatchcase(segments[0], pattern[0])
            and whole(pattern[1:], segments[1:])
        )

    segments = path.split("/")
    return any(whole(glob.split("/"), segments[:k]) for k in range(1, len(segments) + 1))


_SEGMENT_GLOBS = st.sampled_from(["a", "b", "ab", "*", "?", "a*", "*b", "[ab]", "**"])
_SEGMENTS = st.sampled_from(["a", "b", "ab", "ba", "bb"])


@settings(max_examples=300, deadline=None)
@given(
    st.lists(_SEGMENT_GLOBS, min_size=1, max_size=5),
    st.lists(st.lists(_SEGMENTS, min_size=1, max_size=6), min_size=1, max_size=6),
)
def test_glob_matching_follows_the_rule_on_random_globs_and_paths(pattern, paths_):
    glob = "/".join(pattern)
    tree = {"/".join(p): 0.0 for p in paths_}  # one flat dict: each key is one path
    tree_paths = gpaths.paths(tree)
    assert sorted(tree_paths) == sorted(tree)
    expected = [p for p in tree_paths if _reference_match(glob, p)]
    assert select(tree, glob, strict=False) == expected


def test_results_are_in_tree_order_not_string_order():
    params = {"layers": [jnp.ones(1) for _ in range(12)]}
    expected = [f"layers/{i}" for i in range(12)]
    assert select(params, "**") == expected
    assert select(params, ["layers/11", "layers/2", "layers/10"]) == [
        "layers/2",
        "layers/10",
        "layers/11",
    ]


def test_none_leaves_are_never_selected():
    params = {"a": jnp.ones(1), "b": None}
    assert select(params, "**") == ["a"]


def test_a_selection_is_made_again_when_the_present_paths_change():
    # Glob selections are kept per set of present paths: the same structure with a leaf
    # set to None, and a strict call after a lenient one, must not reuse a kept result.
    params = {"a": {"w": jnp.ones(1), "b": jnp.ones(1)}, "c": {"w": jnp.ones(1)}}
    assert select(params, "**/w") == ["a/w", "c/w"]
    assert select({**params, "c": {"w": None}}, "**/w") == ["a/w"]
    assert select(params, "**/w") == ["a/w", "c/w"]
    assert select(params, "**/z", strict=False) == []
    with pytest.raises(SelectorError, match="matches no path"):
        select(params, "**/z")


# --- regex -------------------------------------------------------------------------------------


def test_regex_is_a_full_match():
    assert select(_params(), re.compile(r".*/w")) == [
        "enc/layers/0/w",
        "enc/layers/1/w",
        "head/w",
    ]
    # A partial match is not enough: "head" alone does not match "head/w".
    assert select(_params(), re.compile(r"head"), strict=False) == []
    assert select(_params(), re.compile(r"enc/layers/\d+/b")) == [
        "enc/layers/0/b",
        "enc/layers/1/b",
    ]


# --- bool trees --------------------------------------------------------------------------------


def test_bool_tree_full():
    mask = jax.tree.map(lambda x: x.ndim == 2, _params())
    assert select(_params(), mask) == [
        "enc/layers/0/w",
        "enc/layers/1/w",
        "head/w",
    ]


def test_bool_tree_with_numpy_bools():
    mask = {"enc": np.bool_(False), "head": np.bool_(True), "scale": np.bool_(False)}
    assert select(_params(), mask) == ["head/b", "head/w"]


def test_bool_tree_prefix():
    mask = {"enc": True, "head": {"w": True, "b": False}, "scale": False}
    assert select(_params(), mask) == ALL[:4] + ["head/w"]


def test_bool_tree_deepest_entry_wins():
    mask = {"enc": False, "enc/layers/1/w": True, "head": True, "head/b": False, "scale": False}
    assert select(_params(), mask) == ["enc/layers/1/w", "head/w"]


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class CallableMask:
    """A callable pytree of bools (like an Equinox module): used as data, never called."""

    enc: bool = dataclasses.field(metadata={"static": False})
    head: bool = dataclasses.field(metadata={"static": False})
    scale: bool = dataclasses.field(metadata={"static": False})

    def __call__(self, *args):
        raise AssertionError("a bool-tree selector must never be called")


def test_callable_bool_tree_is_data_and_never_called():
    mask = CallableMask(enc=False, head=True, scale=True)
    assert select(_params(), mask) == ["head/b", "head/w", "scale"]


def test_bool_tree_with_a_path_not_in_the_tree():
    mask = {"enc": True, "head": True, "scale": True, "extra": False}
    with pytest.raises(SelectorError, match=r"bool tree has path 'extra', which is not in the"):
        select(_params(), mask)
    # strict=False ignores it
    assert select(_params(), mask, strict=False) == ALL


def test_bool_tree_missing_a_path():
    mask = {"enc": True, "head": {"w": True}, "scale": False}
    with pytest.raises(SelectorError, match=r"bool tree has no entry for path 'head/b'"):
        select(_params(), mask)


# --- functions ---------------------------------------------------------------------------------


def test_two_argument_function_gets_path_and_leaf():
    seen = []

    def pick(path, leaf):
        seen.append((path, leaf.shape))
        return path.endswith("/b") and leaf.shape == (2,)

    assert select(_params(), pick) == ["enc/layers/0/b", "enc/layers/1/b"]
    assert [p for p, _ in seen] == ALL
    assert dict(seen)["head/w"] == (2, 1)


def test_one_argument_function_is_called_with_the_params():
    calls = []

    def mask_fn(params):
        calls.append(params)
        return jax.tree.map(lambda x: x.ndim == 0, params)

    params = _params()
    assert select(params, mask_fn) == ["scale"]
    assert len(calls) == 1 and calls[0] is params


def test_one_argument_function_may_return_a_prefix():
    assert select(_params(), lambda p: {"enc": False, "head": True, "scale": False}) == [
        "head/b",
        "head/w",
    ]


def test_function_returning_non_bool():
    with pytest.raises(SelectorError, match=r"returned 1 for path 'enc/layers/0/b'"):
        select(_params(), lambda path, leaf: 1)
    with pytest.raises(SelectorError, match=r"must return a Python bool"):
        select(_params(), lambda path, leaf: jnp.sum(leaf) > 0 if leaf.ndim else 0.5)


def test_one_argument_function_returning_non_bool_tree():
    with pytest.raises(SelectorError, match=r"called as f\(params\).*returned dict"):
        select(_params(), lambda params: jax.tree.map(lambda x: 1.0, params))


def test_function_with_three_arguments():
    def pick(path, leaf, extra):
        return True

    with pytest.raises(SelectorError, match=r"takes 3 arguments"):
        select(_params(), pick)


def test_function_with_defaults_counts_required_arguments():
    def pick(path, leaf, unused=None):
        return path == "scale"

    assert select(_params(), pick) == ["scale"]


# --- strictness --------------------------------------------------------------------------------


def test_selector_matching_nothing_is_an_error():
    with pytest.raises(SelectorError, match=r"the glob '\*\*/kernel' matches no path"):
        select(_params(), "**/kernel")
    with pytest.raises(SelectorError, match=r"re.compile\('.\*/kernel'\) matches no path"):
        select(_params(), re.compile(r".*/kernel"))
    with pytest.raises(SelectorError, match=r"matches no path"):
        select(_params(), lambda path, leaf: False)


def test_glob_of_a_list_matching_nothing_names_the_glob():
    with pytest.raises(SelectorError, match=r"the glob 'head/wieght' matches no path"):
        select(_params(), ["**/b", "head/wieght"])


def test_excludes_removing_everything_is_an_error():
    with pytest.raises(SelectorError, match="matches no path"):
        select(_params(), ["head", "!head"])


def test_error_names_the_argument():
    with pytest.raises(SelectorError, match=r"^`mask`: the glob 'nope'"):
        select(_params(), "nope", argument="mask")


def test_strict_false_returns_empty_list():
    assert select(_params(), "**/kernel", strict=False) == []
    assert select(_params(), ["**/kernel", "typo"], strict=False) == []
    assert select(_params(), re.compile("nope"), strict=False) == []
    assert select(_params(), lambda path, leaf: False, strict=False) == []


def test_unusable_selector_type():
    with pytest.raises(SelectorError, match=r"cannot use int 3 as a selector"):
        select(_params(), 3)


def test_as_selector_is_hashable_and_normalises():
    a = gpaths.as_selector(["**/w", "!head/**"])
    b = gpaths.as_selector(("**/w", "!head/**"))
    assert a == b and hash(a) == hash(b)
    mask = {"enc": True, "head": False, "scale": False}
    assert hash(gpaths.as_selector(mask)) == hash(gpaths.as_selector(dict(mask)))
    assert select(_params(), a) == select(_params(), ["**/w", "!head/**"])


# --- labels ------------------------------------------------------------------------------------


def test_resolve_labels_dict_form():
    labels = resolve_labels(_params(), {"body": "enc", "top": ["head", "scale"]})
    assert labels == {
        "enc/layers/0/b": "body",
        "enc/layers/0/w": "body",
        "enc/layers/1/b": "body",
        "enc/layers/1/w": "body",
        "head/b": "top",
        "head/w": "top",
        "scale": "top",
    }
    assert list(labels) == ALL


def test_resolve_labels_callable_form():
    labels = resolve_labels(_params(), lambda path, leaf: "decay" if path.endswith("w") else "none")
    assert labels == {p: ("decay" if p.endswith("w") else "none") for p in ALL}


def test_resolve_labels_label_tree_form():
    tree = {"enc": "body", "head": {"w": "top", "b": "body"}, "scale": "top"}
    labels = resolve_labels(_params(), tree, known=("body", "top"))
    assert labels == {
        "enc/layers/0/b": "body",
        "enc/layers/0/w": "body",
        "enc/layers/1/b": "body",
        "enc/layers/1/w": "body",
        "head/b": "body",
        "head/w": "top",
        "scale": "top",
    }
    full = jax.tree.map(lambda x: "m" if x.ndim == 2 else "v", _params())
    assert resolve_labels(_params(), full, known=("m", "v")) == {
        p: ("m" if p.endswith("w") and p != "head/b" else "v") for p in ALL
    }


def test_resolve_labels_label_tree_of_a_list():
    params = [jnp.ones(1), {"w": jnp.ones(1), "b": jnp.ones(1)}]
    assert resolve_labels(params, ["x", {"w": "y", "b": "x"}]) == {"0": "x", "1/b": "x", "1/w": "y"}


def test_resolve_labels_unlabelled_path():
    with pytest.raises(LabelError, match=r"path 'scale' has no label"):
        resolve_labels(_params(), {"body": "enc", "top": "head"})


def test_resolve_labels_doubly_labelled_path():
    with pytest.raises(LabelError, match=r"path 'head/b' has several labels \['top', 'bias'\]"):
        resolve_labels(_params(), {"body": "enc", "top": ["head", "scale"], "bias": "head/b"})


def test_resolve_labels_unknown_label():
    with pytest.raises(LabelError, match=r"path 'enc/layers/0/b' has label 'x'.*\['a', 'b'\]"):
        resolve_labels(_params(), lambda path, leaf: "x", known=("a", "b"))


def test_resolve_labels_label_tree_missing_a_path():
    with pytest.raises(LabelError, match=r"path 'scale' has no label in the label tree"):
        resolve_labels(_params(), {"enc": "a", "head": "b"}, known=("a", "b"))


def test_resolve_labels_selector_matching_nothing_names_the_label():
    with pytest.raises(SelectorError, match=r"`labels\['b'\]`: the glob 'typo' matches no path"):
        resolve_labels(_params(), {"a": "**", "b": "typo"})


# --- every glob must match, excluding ones too -------------------------------------------------


def _biases_named_b():
    return {
        "enc": {"w": jnp.ones(2), "b": jnp.ones(2)},
        "head": {"w": jnp.ones(2), "b": jnp.ones(2)},
    }


def test_an_exclusion_glob_that_excludes_nothing_is_an_error():
    with pytest.raises(SelectorError, match=r"the glob '!\*\*/bias' excludes nothing: '\*\*/bias'"):
        select(_biases_named_b(), "!**/bias")
    with pytest.raises(SelectorError, match=r"the glob '!hed/\*\*' excludes nothing"):
        select(_biases_named_b(), ["**", "!hed/**"])
    # the message lists the paths, so the fix (`!**/b`) can be read off it
    with pytest.raises(SelectorError, match=r"The tree's paths are: 'enc/b', 'enc/w'"):
        select(_biases_named_b(), ["**/w", "!**/bias"])
    assert select(_biases_named_b(), "!**/b") == ["enc/w", "head/w"]
    assert select(_biases_named_b(), ["**", "!hed/**"], strict=False) == [
        "enc/b",
        "enc/w",
        "head/b",
        "head/w",
    ]


def test_an_exclusion_that_excludes_only_paths_not_included_is_no_error():
    # "!**/b" matches paths, so it is no typo, even where "**/w" already leaves them out.
    assert select(_biases_named_b(), ["**/w", "!**/b"]) == ["enc/w", "head/w"]


def test_an_optimizer_mask_excluding_nothing_fails_at_init():
    with pytest.raises(
        SelectorError, match=r"add_decayed_weights\(mask=...\)`: the glob '!\*\*/bias'"
    ):
        gradtx.adamw(0.1, weight_decay=0.5, mask="!**/bias").init(_biases_named_b())


def test_freeze_with_an_exclusion_that_excludes_nothing_fails_at_init():
    with pytest.raises(
        SelectorError, match=r"freeze\(where='!head/bias'\)`: the glob '!head/bias'"
    ):
        gradtx.freeze(gradtx.adam(0.1), "!head/bias").init(_biases_named_b())
    state = gradtx.freeze(gradtx.adam(0.1), "!head/b").init(_biases_named_b())
    assert sorted(gradtx.state_dict(state)) == ["count/head/b", "mu/head/b", "nu/head/b"]


# --- None leaves are paths of the tree for the checks ------------------------------------------


def _group_of_enc():
    """What a combinator hands the group `enc`: the other paths are `None`."""
    return {"enc": {"w": jnp.ones((2, 2)), "b": jnp.ones(2)}, "head": {"w": None, "b": None}}


def test_a_glob_matching_only_absent_paths_selects_nothing_without_error():
    assert select(_group_of_enc(), "head/**") == []
    assert select(_group_of_enc(), ["**/w", "!head"]) == ["enc/w"]
    with pytest.raises(SelectorError, match=r"the glob 'haed/\*\*' matches no path"):
        select(_group_of_enc(), "haed/**")
    with pytest.raises(SelectorError, match=r"the glob '!haed' excludes nothing"):
        select(_group_of_enc(), ["**", "!haed"])


def test_a_whole_model_bool_tree_may_name_absent_paths_and_select_none_present():
    whole = {"enc": {"w": True, "b": False}, "head": {"w": True, "b": False}}
    assert select(_group_of_enc(), whole) == ["enc/w"]
    assert select(_group_of_enc(), {"enc": False, "head": True}) == []
    with pytest.raises(SelectorError, match="matches no path"):
        select(_group_of_enc(), {"enc": False, "head": False})
    with pytest.raises(SelectorError, match=r"bool tree has path 'tail', which is not in"):
        select(_group_of_enc(), {"enc": True, "head": True, "tail": False})


def test_an_optax_style_mask_function_in_a_group():
    def matrices(params):
        return jax.tree.map(lambda x: x.ndim > 1, params)

    assert select(_group_of_enc(), matrices) == ["enc/w"]
    only_vectors = {"enc": {"w": None, "b": jnp.ones(2)}, "head": {"w": None, "b": None}}
    assert select(only_vectors, matrices) == []  # another group's matrices, unknown here


def test_a_regex_matching_only_absent_paths_selects_nothing_without_error():
    assert select(_group_of_enc(), re.compile(r"head/.*")) == []
    with pytest.raises(SelectorError, match="matches no path"):
        select(_group_of_enc(), re.compile(r"tail/.*"))


# --- labels: functions follow the selector rule, dicts take their valid reading ----------------


def test_a_two_argument_label_function_gets_the_path_and_leaf():
    seen = []

    def label(path, leaf):
        seen.append((path, leaf.shape))
        return "matrix" if leaf.ndim == 2 else "other"

    labels = resolve_labels(_params(), label)
    assert labels == {p: ("matrix" if p.endswith("w") else "other") for p in ALL}
    assert [p for p, _ in seen] == ALL


def test_a_one_argument_label_function_is_called_with_the_params_optax_style():
    calls = []

    def label_tree(params):
        calls.append(params)
        return jax.tree.map(lambda x: "matrix" if x.ndim == 2 else "other", params)

    params = _params()
    labels = resolve_labels(params, label_tree, known=("matrix", "other"))
    assert labels == {p: ("matrix" if p.endswith("w") else "other") for p in ALL}
    assert len(calls) == 1 and calls[0] is params
    # a prefix of the params works too
    prefix = resolve_labels(params, lambda p: {"enc": "a", "head": "b", "scale": "b"})
    assert prefix == {p: ("a" if p.startswith("enc") else "b") for p in ALL}
    assert set(resolve_labels(params, lambda p: "a").values()) == {"a"}  # a label for the root


def test_label_function_errors_name_the_calling_convention():
    with pytest.raises(
        LabelError, match=r"called as f\(params\) and must return a pytree of labels"
    ):
        resolve_labels(_params(), lambda params: {"enc": 1.5})
    with pytest.raises(LabelError, match=r"called as f\(path, leaf\) and must return a str or int"):
        resolve_labels(_params(), lambda path, leaf: None)
    with pytest.raises(LabelError, match=r"must take `\(path, leaf\)` or `\(params\)`.*takes 3"):
        resolve_labels(_params(), lambda path, leaf, extra: "a")


def _abc():
    return {"a": {"w": jnp.ones(1)}, "b": {"w": jnp.ones(1)}, "c": {"w": jnp.ones(1)}}


def test_a_dict_valid_both_ways_with_the_same_labels_is_fine():
    both = resolve_labels(_abc(), {"a": "a", "b": "b", "c": "c"}, known=("a", "b", "c"))
    assert both == {"a/w": "a", "b/w": "b", "c/w": "c"}


def test_a_dict_valid_both_ways_with_different_labels_raises_showing_both():
    cycle = {"a": "b", "b": "c", "c": "a"}
    with pytest.raises(LabelError, match="reads two ways") as error:
        resolve_labels(_abc(), cycle, known=("a", "b", "c"))
    message = str(error.value)
    # as {label: selector}, label "a" takes "b/**"; as a label tree, "a/**" takes label "b"
    assert "As `{label: selector}`: 'a/w' -> 'c', 'b/w' -> 'a', 'c/w' -> 'b'" in message
    assert "As a tree of labels shaped like the params: 'a/w' -> 'b', 'b/w' -> 'c'" in message


def test_a_dict_valid_only_as_a_label_tree_is_a_label_tree():
    params = {"enc": {"w": jnp.ones(1), "b": jnp.ones(1)}, "head": {"w": jnp.ones(1)}}
    labels = {"enc": {"w": "enc", "b": "enc"}, "head": {"w": "head"}}
    assert resolve_labels(params, labels, known=("enc", "head")) == {
        "enc/b": "enc",
        "enc/w": "enc",
        "head/w": "head",
    }
    # a label for every path of one group and none of the other: as selectors, "enc" would
    # label the same paths twice
    doubled = {"enc": "enc", "head": "enc"}
    assert set(resolve_labels(params, doubled, known=("enc", "head")).values()) == {"enc"}


def test_a_dict_valid_only_as_selectors_is_read_as_selectors():
    params = {"enc": {"w": jnp.ones(1), "b": jnp.ones(1)}, "head": {"w": jnp.ones(1)}}
    labels = resolve_labels(params, {"enc": "**/w", "head": "**/b"}, known=("enc", "head"))
    assert labels == {"enc/b": "head", "enc/w": "enc", "head/w": "enc"}


def test_a_dict_valid_neither_way_shows_both_reasons():
    params = {"enc": {"w": jnp.ones(1)}, "head": {"w": jnp.ones(1)}}
    with pytest.raises(LabelError, match=r"reads neither way. As `\{label: selector\}`: .*'nope'"):
        resolve_labels(params, {"enc": "enc", "head": "nope"}, known=("enc", "head"))
