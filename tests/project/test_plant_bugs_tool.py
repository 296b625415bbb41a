"""tools/plant_bugs.py plants the bugs it says it plants, and only in code.

Only the mutant generator, the diff reader and the draw are exercised here: running pytest
per mutant is the tool's own job, run by hand (CONTRIBUTING.md).
"""

from __future__ import annotations

import ast
import doctest
import importlib.util
import sys
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[2] / "tools" / "plant_bugs.py"


def _load():
    spec = importlib.util.spec_from_file_location("plant_bugs", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


pb = _load()


def _mutated(source: str, lines=None) -> list[tuple[int, str]]:
    return [(m.line, m.mutated_line) for m in pb.mutants_of_source(source, "m.py", lines)]


SOURCE = """\
def f(a, b, xs):
    if a < b and a != 0:
        a += 1
    c = -a * b
    return min(a, c) if not xs else jnp.maximum(a, c) - True
"""


def test_every_operator_family_is_swapped():
    assert _mutated(SOURCE) == [
        (2, "    if a <= b and a != 0:"),
        (2, "    if a < b or a != 0:"),
        (2, "    if a < b and a == 0:"),
        (2, "    if a < b and a != 1:"),
        (3, "        a -= 1"),
        (3, "        a += 2"),
        (4, "    c = a * b"),
        (4, "    c = -a / b"),
        (5, "    return max(a, c) if not xs else jnp.maximum(a, c) - True"),
        (5, "    return min(a, c) if xs else jnp.maximum(a, c) - True"),
        (5, "    return min(a, c) if not xs else jnp.minimum(a, c) - True"),
        (5, "    return min(a, c) if not xs else jnp.maximum(a, c) + True"),
        (5, "    return min(a, c) if not xs else jnp.maximum(a, c) - False"),
    ]


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ("x = a is not None", "x = a is None"),
        ("x = a not in b", "x = a in b"),
        ("x = a in b", "x = a not in b"),
        ("x = a >= (b)", "x = a > (b)"),
        ("x = not (a or b)", "x = (a or b)"),
        ("x = a / b", "x = a * b"),
        ("x = a < b <= c", "x = a <= b <= c"),
        ("if a:\n    pass\nelif a < b:\n    pass", "elif a <= b:"),
        ("class C:\n    @dataclass(frozen=True)\n    class D: ...", "    @dataclass(frozen=False)"),
        ("@dataclass(frozen=True)\nclass D: ...", "@dataclass(frozen=False)"),
        ('def f(s):\n    return """\ntext\n""" if s == 1 else s', '""" if s != 1 else s'),
    ],
)
def test_operators_written_in_several_tokens_or_parentheses(before, after):
    assert after in [line for _, line in _mutated(before + "\n")]


def test_text_for_people_and_annotations_are_left_alone():
    source = '''\
"""A module docstring: a < b and 1 + 2."""
import warnings


def f(a: int = 0, *, flag: bool = True) -> list[int]:
    """a < b, 1 + 1."""  # a < b
    n: Literal[3] = 0
    warnings.warn(f"{a + 1} < 2", stacklevel=2)
    logger.info("%d", a - 1)
    print(a * 2)
    assert a, f"{a + 1}"
    msg = "x" + str(a)
    raise ValueError(f"{a} must be < {a + 1}" if a > 1 else "no")


class C:
    def __repr__(self):
        return f"C({self.a + 1})" + str(self.b - 1)
'''
    assert _mutated(source) == [
        (5, "def f(a: int = 1, *, flag: bool = True) -> list[int]:"),
        (5, "def f(a: int = 0, *, flag: bool = False) -> list[int]:"),
        (7, "    n: Literal[3] = 1"),
    ]


def test_only_the_chosen_lines_are_mutated():
    assert {line for line, _ in _mutated(SOURCE, lines={3, 4})} == {3, 4}
    # An expression over several lines: the operator's own line decides.
    source = "x = (a\n     + b)\n"
    assert _mutated(source, lines={1}) == []
    assert _mutated(source, lines={2}) == [(2, "     - b)")]


def test_a_mutant_changes_one_line_and_still_parses():
    source = "# é\ndef g(a):\n    return 'é' == a or a <= 2  # é\n"
    mutants = pb.mutants_of_source(source, "m.py")
    assert len(mutants) == 4
    for mutant in mutants:
        mutated = pb.apply_mutant(source, mutant)
        ast.parse(mutated)
        changed = [
            (old, new)
            for old, new in zip(source.splitlines(True), mutated.splitlines(True))
            if old != new
        ]
        assert len(changed) == 1 and changed[0][1].endswith("\n")


def test_a_stale_mutant_is_refused():
    mutant = pb.mutants_of_source("x = 1 + 2\n", "m.py")[0]
    with pytest.raises(ValueError, match=r"m\.py:1 changed since its mutants were made"):
        pb.apply_mutant("x = 1 - 2\n", mutant)


def test_the_diff_gives_added_and_changed_lines():
    diff = (
        "diff --git a/gradtx/a.py b/gradtx/a.py\n"
        "--- a/gradtx/a.py\n+++ b/gradtx/a.py\n"
        "@@ -3,0 +4,2 @@\n+x\n+y\n@@ -9 +11 @@\n-z\n+w\n@@ -20,3 +22,0 @@\n-a\n-b\n-c\n"
        "--- a/gradtx/gone.py\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-p\n-q\n"
        "--- a/gradtx/cut.py\n+++ b/gradtx/cut.py\n@@ -5 +4,0 @@\n-r\n"
    )
    assert pb.parse_diff(diff) == {"gradtx/a.py": {4, 5, 11}}


def test_the_draw_is_repeatable_and_keeps_the_order():
    items = list(range(50))
    drawn = pb.select(items, 10, seed=3)
    assert drawn == pb.select(items, 10, seed=3) == sorted(drawn)
    assert len(drawn) == 10 and drawn != pb.select(items, 10, seed=4)
    assert pb.select(items, None, seed=0) == pb.select(items, 99, seed=0) == items


def test_the_tools_examples_run():
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    report: list[str] = []
    for test in finder.find(pb, "plant_bugs"):
        runner.run(test, out=report.append)
    assert runner.summarize(verbose=False).attempted >= 4
    assert not report, "".join(report)


ROOT = TOOL.parents[1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--list"], "give --base REV"),
        (["--paths", "README.md", "--list"], "--paths: 'README.md' is neither a .py file"),
        (["--paths", "tools", "--list", "--max", "0"], "--max must be at least 1, got 0"),
        (["--paths", "tools", "--list", "--timeout", "-1"], "--timeout must be a positive"),
        (["--paths", "tools"], "give --tests"),
        (["--paths", "tools", "--tests", "tests/nope"], "no such test file or folder: 'tests/n"),
        (["--paths", "/", "--list"], "lies outside the repository"),
    ],
)
def test_a_bad_argument_stops_with_a_usage_error(argv, message, monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as stopped:
        pb.main(argv)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_tests_may_name_one_test(monkeypatch):
    monkeypatch.chdir(ROOT / "tests" / "project")
    spec = pb._test_spec("test_plant_bugs_tool.py::test_a")
    assert spec == "tests/project/test_plant_bugs_tool.py::test_a"


def test_list_prints_the_drawn_mutants(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    assert pb.main(["--paths", "tools/plant_bugs.py", "--list", "--max", "3", "--seed", "5"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and lines[-1] == "3 mutant(s)."
    assert all(line.startswith("tools/plant_bugs.py:") and "  ->  " in line for line in lines[:3])


def test_the_summary_counts_timeouts_as_kills_and_names_the_survivors():
    [a, b, c, d] = pb.mutants_of_source("x = a < b + 1 - c\n", "m.py")
    outcomes = [
        pb.Outcome(a, "killed", 1.0),
        pb.Outcome(b, "timeout", 9.0),
        pb.Outcome(c, "survived", 1.0),
        pb.Outcome(d, "killed", 1.0),
    ]
    assert list(pb._summary(outcomes)) == [
        "\n1 survivor(s), bugs the tests did not catch:",
        f"  {c.describe()}",
        "\nkilled 3 of 4 mutants (75%): 2 by a failing test, 1 by the timeout; 1 survived.",
    ]
    assert list(pb._summary([pb.Outcome(a, "skipped", 0.0)])) == ["\nno mutant ran to its end."]
