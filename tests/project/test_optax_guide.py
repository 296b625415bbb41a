"""docs/reference/optax-names.md stays true: its table of names and its "not covered" list.

The page maps optax's public names to gradtx's and lists those gradtx does not cover. These
tests parse both and check them against the installed optax and gradtx, so a name added to
or removed from either library fails here until the page says so.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import optax
import pytest

import gradtx

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "optax-names.md"
NAMESPACES = ("optax", "optax.schedules", "optax.contrib")


def _section(text: str, heading: str) -> str:
    match = re.search(rf"^## {re.escape(heading)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"{PAGE.name} has no section '## {heading}'"
    return match.group(1)


def _table() -> list[tuple[str, list[str], list[str]]]:
    """`(row, optax names, gradtx names)` for each row of the table of names."""
    rows = []
    for line in _section(PAGE.read_text(), "The names").splitlines():
        if not line.startswith("| `"):
            continue
        cells = line.split(" | ")
        optax_names = re.findall(r"`([^`]+)`", cells[0])
        gradtx_names = re.findall(r"`([^`]+)`", cells[1])
        rows.append((line, optax_names, gradtx_names))
    return rows


def _not_covered() -> list[str]:
    section = _section(PAGE.read_text(), "What gradtx does not cover")
    return re.findall(r"`(optax\.[\w.]+)`", section)


def _resolve(dotted: str) -> object:
    """The object a dotted name refers to, from its top module down; raises if absent."""
    head, *rest = dotted.split(".")
    obj = {"optax": optax, "gradtx": gradtx}[head]
    with warnings.catch_warnings():  # some optax names are deprecated aliases that warn
        warnings.simplefilter("ignore")
        for part in rest:
            obj = getattr(obj, part)
    return obj


def _public(namespace: str) -> list[str]:
    """The public names of an optax namespace (as `dir` lists them)."""
    return [f"{namespace}.{n}" for n in dir(_resolve(namespace)) if not n.startswith("_")]


def _gradtx_names() -> set[str]:
    names = set(gradtx.__all__)
    for namespace in ("schedules", "contrib", "tree", "paths"):
        names |= set(getattr(gradtx, namespace).__all__)
    return names


def _table_optax_names() -> list[str]:
    return [name for _, names, _ in _table() for name in names]


def test_the_page_is_parsed():
    # Guard against vacuous checks: both lists are long, and every row names both sides.
    assert len(_table()) > 100 and len(_not_covered()) > 100
    for row, optax_names, gradtx_names in _table():
        assert len(optax_names) == 1 and optax_names[0].startswith("optax"), row
        assert gradtx_names and all(n.split(".")[0] == "gradtx" for n in gradtx_names), row


@pytest.mark.parametrize("row", _table(), ids=lambda r: r[1][0])
def test_every_name_in_the_table_exists(row):
    _, optax_names, gradtx_names = row
    for name in optax_names + gradtx_names:
        try:
            _resolve(name)
        except AttributeError:
            pytest.fail(f"{PAGE.name}: {name} does not exist (row: {row[0]})")


def test_every_name_not_covered_exists_in_optax():
    missing = []
    for name in _not_covered():
        try:
            _resolve(name)
        except AttributeError:
            missing.append(name)
    assert not missing, f"{PAGE.name} lists names the installed optax does not have: {missing}"


def test_names_not_covered_really_are_not():
    ours = _gradtx_names()
    covered = [n for n in _not_covered() if n.rpartition(".")[2] in ours]
    assert not covered, f"{PAGE.name} says gradtx lacks these, but it has them: {covered}"
    in_table = sorted(set(_not_covered()) & set(_table_optax_names()))
    assert not in_table, f"{PAGE.name} both maps and lists as not covered: {in_table}"


def test_no_name_is_listed_twice():
    names = _table_optax_names() + _not_covered()
    repeated = sorted({n for n in names if names.count(n) > 1})
    assert not repeated, f"{PAGE.name} lists these more than once: {repeated}"


def test_every_optax_name_gradtx_shares_is_in_the_table():
    ours, table = _gradtx_names(), set(_table_optax_names())
    shared = [
        name
        for namespace in NAMESPACES
        for name in _public(namespace)
        if name.rpartition(".")[2] in ours and name.rpartition(".")[2] not in ("contrib", "tree")
    ]
    # A name optax also exports at its top is listed there, once.
    absent = [n for n in shared if n not in table and f"optax.{n.rpartition('.')[2]}" not in table]
    assert not absent, f"gradtx has these optax names, but {PAGE.name}'s table lacks them: {absent}"


def test_every_public_optax_name_is_on_the_page():
    # A newer optax may add names: the page says which release its list was checked against.
    checked = re.search(r"checked against optax (\S+?)\.?$", PAGE.read_text(), re.MULTILINE)
    assert checked, f"{PAGE.name} should say which optax release its list was checked against"
    if optax.__version__ != checked.group(1):
        pytest.skip(
            f"{PAGE.name} lists optax {checked.group(1)}'s names; this is {optax.__version__}"
        )
    on_page = set(_table_optax_names()) | set(_not_covered())
    top = set(_public("optax"))
    absent = [
        name
        for namespace in NAMESPACES
        for name in _public(namespace)
        if name not in on_page and f"optax.{name.rpartition('.')[2]}" not in (on_page & top)
    ]
    assert not absent, (
        f"optax has public names that {PAGE.name} neither maps nor lists as not covered: {absent}"
    )
