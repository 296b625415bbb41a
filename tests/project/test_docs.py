"""The documentation stays true: API reference coverage, runnable examples, paired notebooks."""

from __future__ import annotations

import contextlib
import doctest
import importlib
import importlib.util
import io
import json
import pkgutil
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

import gradtx

ROOT = Path(__file__).resolve().parents[2]
# The API reference: one page per section, each opening with a summary table; and contrib's page
# The optax name table sits among the reference pages but documents no gradtx name.
OPTAX_NAMES = ROOT / "docs" / "reference" / "optax-names.md"
SECTIONS = sorted(p for p in (ROOT / "docs" / "reference").glob("*.md") if p != OPTAX_NAMES)
REFERENCE = [*SECTIONS, ROOT / "docs" / "contrib.md"]
HOME = ROOT / "docs" / "index.md"
NOTEBOOKS = ROOT / "notebooks"
PAGES = [
    "README.md",
    "docs/getting-started.md",
    "docs/paths-and-selectors.md",
    "docs/parameter-groups.md",
    "docs/observe-and-checkpoint.md",
    "docs/recipes.md",
    "docs/packed-params.md",
    "docs/numerics.md",
    "docs/contrib.md",
    "docs/coming-from-optax.md",
    "docs/howto-equinox-optax.md",
    "docs/howto-flax-nnx.md",
    "docs/sharding.md",
    "docs/misuse.md",
]
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _api_targets(*pages: Path) -> list[str]:
    """The `::: name` blocks of `pages` (every reference page by default), in order."""
    pattern = re.compile(r"^::: *([\w.]+) *$", flags=re.MULTILINE)
    return [name for page in pages or REFERENCE for name in pattern.findall(page.read_text())]


def _public_names() -> list[str]:
    names = [f"gradtx.{n}" for n in gradtx.__all__]
    names += [f"gradtx.paths.{n}" for n in gradtx.paths.__all__]
    names += [f"gradtx.projections.{n}" for n in gradtx.projections.__all__]
    names += [f"gradtx.schedules.{n}" for n in gradtx.schedules.__all__]
    names += [f"gradtx.tree.{n}" for n in gradtx.tree.__all__]
    names += [f"gradtx.contrib.{n}" for n in gradtx.contrib.__all__]
    return names


def _resolve(dotted: str) -> object:
    module, _, attr = dotted.rpartition(".")
    try:
        return importlib.import_module(dotted)
    except ImportError:
        return getattr(importlib.import_module(module), attr)


# --- API reference -----------------------------------------------------------------------------


def test_every_public_name_is_in_the_api_reference():
    targets = set(_api_targets())
    missing = [name for name in _public_names() if name not in targets]
    assert not missing, f"docs/reference/ has no `::: name` block for: {missing}"


def test_api_reference_has_no_stale_or_repeated_entries():
    targets = _api_targets()
    repeated = sorted({t for t in targets if targets.count(t) > 1})
    assert not repeated, f"docs/reference/ documents these more than once: {repeated}"
    for target in targets:
        _resolve(target)  # raises if the name no longer exists


def test_the_coverage_check_sees_a_missing_name(tmp_path):
    # Guard against a vacuous check: with one entry dropped, that name must be missing.
    (page,) = [p for p in REFERENCE if "::: gradtx.reconcile\n" in p.read_text()]
    fake = tmp_path / page.name
    fake.write_text(page.read_text().replace("::: gradtx.reconcile\n", ""))
    others = [p for p in REFERENCE if p != page]
    assert "gradtx.reconcile" in _api_targets()
    assert "gradtx.reconcile" not in _api_targets(fake, *others)
    assert "gradtx.reconcile" in _public_names()


def _is_module(dotted: str) -> bool:
    try:
        importlib.import_module(dotted)
    except ImportError:
        return False
    return True


def _summary(page: Path) -> list[str]:
    """The names a reference page's summary table links to, in order (`[`x`](#gradtx.x)`)."""
    return re.findall(r"^\| \[`[\w.]+`\]\(#([\w.]+)\) \|", page.read_text(), flags=re.MULTILINE)


@pytest.mark.parametrize("page", SECTIONS, ids=lambda p: p.name)
def test_reference_page_opens_with_a_summary_of_its_entries(page):
    """The table lists each entry of the page once, in the page's order (module intros aside)."""
    entries = [name for name in _api_targets(page) if not _is_module(name)]
    assert _summary(page) == entries
    text = page.read_text()
    assert text.index("| name |") < text.index(f"::: {entries[0]}\n")


def test_every_reference_page_is_in_the_site():
    """Each page is in the navigation and linked from the reference's overview."""
    nav, overview = (ROOT / "mkdocs.yml").read_text(), (ROOT / "docs" / "api.md").read_text()
    for page in REFERENCE:
        path = page.relative_to(ROOT / "docs").as_posix()
        assert f": {path}\n" in nav, f"{path} is not in mkdocs.yml's nav"
        assert f"]({path})" in overview, f"docs/api.md does not link {path}"


# --- docstring examples ------------------------------------------------------------------------


def _modules() -> list[str]:
    """Every module of the package, in every layer folder and in contrib."""
    found = pkgutil.walk_packages(gradtx.__path__, prefix="gradtx.")
    return sorted(m.name for m in found)


def _run_doctests(tests: list[doctest.DocTest]) -> tuple[int, str]:
    """Run `tests` in order (they may share globals); return (examples run, failure report)."""
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS, verbose=False)
    for test in tests:
        runner.run(test, out=report.append, clear_globs=False)
    return runner.summarize(verbose=False).attempted, "".join(report)


@pytest.mark.parametrize("module_name", _modules())
def test_docstring_examples(module_name):
    """Every `Example:` in the package runs and prints what it shows (strict promotion)."""
    module = importlib.import_module(module_name)
    # As `doctest.testmod(module, extraglobs=...)`: the module's namespace plus the usual names.
    globs = {**vars(module), "gradtx": gradtx, "jnp": jnp, "jax": jax}
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = finder.find(module, module_name, globs=globs)
    _, report = _run_doctests(tests)
    assert not report, report


def test_public_functions_have_examples():
    without = []
    for name in _public_names():
        obj = _resolve(name)
        if callable(obj) and not isinstance(obj, type) and ">>>" not in (obj.__doc__ or ""):
            without.append(name)
    allowed = {"gradtx.paths.paths"}  # a one-liner next to `leaves`, which has one
    assert set(without) <= allowed, f"public functions without an Example: {without}"


# --- runnable pages ----------------------------------------------------------------------------


def _page_doctests(path: Path) -> list[doctest.DocTest]:
    """One doctest per ```pycon block of a page, sharing one namespace, with true line numbers."""
    text = path.read_text()
    globs: dict = {}
    parser = doctest.DocTestParser()
    tests = []
    for match in re.finditer(r"^```pycon\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL):
        lineno = text.count("\n", 0, match.start(1))
        test = parser.get_doctest(match.group(1), globs, path.name, str(path), lineno)
        test.globs = globs  # get_doctest copies the namespace; the blocks share one
        tests.append(test)
    return tests


@pytest.mark.parametrize("page", PAGES)
def test_page_examples_run(page):
    """The ```pycon blocks of each page run top to bottom and print what they show."""
    tests = _page_doctests(ROOT / page)
    expected = sum(len(test.examples) for test in tests)
    assert expected >= 3, f"{page} has too few runnable examples"
    # User code may broadcast ranks freely; dtype promotion stays strict (from conftest).
    with jax.numpy_rank_promotion("allow"):
        attempted, report = _run_doctests(tests)
    assert attempted == expected
    assert not report, report


def test_home_page_example_runs():
    """The home page's ```python example runs, and each `print(...)  # shown` prints `shown`."""
    (code,) = re.findall(r"^```python\n(.*?)^```", HOME.read_text(), flags=re.MULTILINE | re.DOTALL)
    assert 10 <= sum(1 for line in code.splitlines() if line.strip()) <= 20
    shown = re.findall(r"^print\(.*\)  # (.*)$", code, flags=re.MULTILINE)
    assert shown, "the example shows no output"
    out = io.StringIO()
    # User code may broadcast ranks freely, as on the other pages.
    with jax.numpy_rank_promotion("allow"), contextlib.redirect_stdout(out):
        exec(compile(code, str(HOME), "exec"), {"__name__": "__main__"})
    assert out.getvalue().splitlines() == shown


# --- tables ------------------------------------------------------------------------------------

TABLE_PAGES = sorted([*ROOT.glob("docs/**/*.md"), ROOT / "README.md", ROOT / "CHANGELOG.md"])
SEPARATOR = re.compile(r"\|(\s*:?-+:?\s*\|)+")


def _cells(row: str) -> int:
    """How many cells a table row has: its pipes outside code spans, less the outer two."""
    outside = re.sub(r"`[^`]*`", "", row.strip())
    return outside.count("|") - 1


def _table_faults(text: str) -> list[str]:
    """Each table row, by line number, that Markdown would not render as its table's row."""
    faults, lines, fenced, columns = [], text.split("\n"), False, None
    for number, line in enumerate(lines, start=1):
        fenced ^= line.startswith("```")
        if fenced or not line.startswith("|"):
            columns = None
            continue
        if columns is None:  # a header: the next line must separate it from the rows
            columns = _cells(line)
            below = lines[number] if number < len(lines) else ""
            if not SEPARATOR.fullmatch(below.strip()):
                faults.append(f"line {number}: a table header without a |---| line under it")
        elif _cells(line) != columns:
            faults.append(f"line {number}: {_cells(line)} cells in a table of {columns}")
    return faults


@pytest.mark.parametrize("page", TABLE_PAGES, ids=lambda p: p.name)
def test_every_table_renders(page):
    """Each page's tables have a separator under the header and as many cells in every row."""
    assert not _table_faults(page.read_text()), (page.name, _table_faults(page.read_text()))


def test_the_table_check_sees_a_missing_separator_and_a_short_row():
    text = "| a | b |\n| 1 | 2 |\n\n| a | `x | y` |\n|---|---|\n| 1 |\n"
    assert _table_faults(text) == [
        "line 1: a table header without a |---| line under it",
        "line 6: 1 cells in a table of 2",
    ]


# --- notebooks ---------------------------------------------------------------------------------


def _cells_from_ipynb(path: Path) -> list[tuple[str, str]]:
    nb = json.loads(path.read_text())
    return [(cell["cell_type"], "".join(cell["source"])) for cell in nb["cells"]]


def _paired() -> list[Path]:
    return sorted(NOTEBOOKS.glob("*.py"))


def test_every_notebook_is_paired():
    py = {p.stem for p in NOTEBOOKS.glob("*.py")}
    ipynb = {p.stem for p in NOTEBOOKS.glob("*.ipynb")}
    assert py, "no notebooks/*.py found"
    assert py == ipynb, f"unpaired notebooks: {sorted(py ^ ipynb)}"


@pytest.mark.parametrize("source", _paired(), ids=lambda p: p.name)
def test_notebook_in_sync_with_its_py(source):
    jupytext = pytest.importorskip("jupytext")
    expected = [(cell.cell_type, cell.source) for cell in jupytext.read(source).cells]
    notebook = source.with_suffix(".ipynb")
    assert _cells_from_ipynb(notebook) == expected, (
        f"{notebook.name} differs from {source.name}; regenerate it with "
        f"`jupytext --to ipynb {source.relative_to(ROOT)}`"
    )


@pytest.mark.parametrize("source", _paired(), ids=lambda p: p.name)
def test_notebook_has_no_stored_outputs(source):
    nb = json.loads(source.with_suffix(".ipynb").read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [] and cell["execution_count"] is None


def test_the_site_shows_a_notebook_executed_only_while_it_is_current(tmp_path, monkeypatch):
    """docs/hooks/notebooks.py reads build/notebooks/<name>.ipynb if its cells are the source's."""
    spec = importlib.util.spec_from_file_location(
        "notebooks_hook", ROOT / "docs/hooks/notebooks.py"
    )
    assert spec and spec.loader
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)
    monkeypatch.setattr(hook, "EXECUTED", tmp_path)
    source = NOTEBOOKS / "quickstart.ipynb"
    assert hook._source_dir(source) == hook.ROOT  # no executed copy
    executed = json.loads(source.read_text())
    executed["cells"][1]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "1\n"}]
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "notebooks" / source.name).write_text(json.dumps(executed))
    assert hook._source_dir(source) == tmp_path  # current: shown with its outputs
    executed["cells"][1]["source"] = ["an older cell"]
    (tmp_path / "notebooks" / source.name).write_text(json.dumps(executed))
    assert hook._source_dir(source) == hook.ROOT  # stale: the committed notebook instead
