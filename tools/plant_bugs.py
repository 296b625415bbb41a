"""Plant one-line bugs in the modules a change touched and count how many the tests catch.

    .venv/bin/python tools/plant_bugs.py --base origin/main --tests tests/schedules
    .venv/bin/python tools/plant_bugs.py --paths gradtx/_schedules/decays.py \
        --tests tests/schedules --max 15

Each mutant changes one source line by one operator swap (`<` to `<=`, `==` to `!=`, `and`
to `or`, `+` to `-`, `*` to `/`, `True` to `False`, a small integer off by one, a `not` or
a unary minus dropped, `min` to `max`). Only code is mutated: docstrings, comments, f-strings,
the arguments of `raise`, warnings, logging and `print`, assertion messages and annotations
are left alone. Each mutant runs the given tests in a temporary copy of the working tree
(the checkout is never modified), with `PYTHONPATH` pointing at the copy; a failing or
timed-out run kills it. The survivors and the kill rate are printed; the exit status is 0
whatever the kill rate (2 for a usage error, or when the tests fail without any mutant).

A developer tool: pytest does not collect it and `make test` does not run it.
"""

from __future__ import annotations

import argparse
import ast
import bisect
import io
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tokenize
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from queue import Queue

ROOT = Path(__file__).resolve().parents[1]

COMPARE_SWAPS = {
    "<": "<=",
    "<=": "<",
    ">": ">=",
    ">=": ">",
    "==": "!=",
    "!=": "==",
    "is": "is not",
    "is not": "is",
    "in": "not in",
    "not in": "in",
}
BINARY_SWAPS = {"+": "-", "-": "+", "*": "/", "/": "*"}
AUGMENTED_SWAPS = {f"{a}=": f"{b}=" for a, b in BINARY_SWAPS.items()}
BOOLEAN_SWAPS = {"and": "or", "or": "and"}
CALL_SWAPS = {"min": "max", "max": "min", "minimum": "maximum", "maximum": "minimum"}
SMALL_INT = 10  # integer literals 0..SMALL_INT are moved by one
# Calls whose arguments only build a message for people.
MESSAGE_CALLS = {"warn", "print", "debug", "info", "warning", "error", "exception", "critical"}
MESSAGE_OWNERS = {"warnings", "logging", "logger", "log", "_logger", "LOGGER"}
_SKIPPED_TOKENS = {
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.COMMENT,
    tokenize.INDENT,
    tokenize.DEDENT,
}


class UsageError(Exception):
    """A command-line argument that cannot work; the message names it and the fix."""


@dataclass(frozen=True)
class Mutant:
    """One planted bug: `line` of `path` with `[start:end]` replaced by `replacement`.

    `start` and `end` are character offsets into `original_line` (the line without its end
    of line); `path` is relative to the repository root, with `/` separators.
    """

    path: str
    line: int
    start: int
    end: int
    replacement: str
    original_line: str

    @property
    def mutated_line(self) -> str:
        """The line with the bug planted."""
        line = self.original_line
        return line[: self.start] + self.replacement + line[self.end :]

    def describe(self) -> str:
        """`path:line: original  ->  mutated`, the lines stripped of their indentation."""
        before, after = self.original_line.strip(), self.mutated_line.strip()
        return f"{self.path}:{self.line}: {before}  ->  {after}"


def mutants_of_source(source: str, path: str, lines: Iterable[int] | None = None) -> list[Mutant]:
    r"""The one-line mutants of a module's source, on `lines` only (all lines when None).

    Args:
        source: the text of a Python module.
        path: the module's path, as the mutants will name it.
        lines: 1-based line numbers to mutate; a mutant's changed text lies on one of them.

    Returns:
        The mutants, sorted by line and column; each one's module still parses.

    Raises:
        SyntaxError: `source` is not valid Python.

    Examples:
        >>> src = "def f(a, b):\n    return a < b and not a\n"
        >>> [m.describe() for m in mutants_of_source(src, "m.py")]
        ['m.py:2: return a < b and not a  ->  return a <= b and not a',
         'm.py:2: return a < b and not a  ->  return a < b or not a',
         'm.py:2: return a < b and not a  ->  return a < b and a']
    """
    tree = ast.parse(source)
    text_lines = source.splitlines()
    wanted = None if lines is None else set(lines)
    finder = _Finder(text_lines, _tokens(source))
    finder.visit(tree)
    spans = sorted(
        (node.end_lineno - node.lineno, node.lineno, node.end_lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.stmt)
    )
    found: dict[tuple[int, int, int, str], Mutant] = {}
    for row, start, end, replacement in finder.edits:
        if wanted is not None and row not in wanted:
            continue
        mutant = Mutant(path, row, start, end, replacement, text_lines[row - 1])
        # The smallest statement around the line is checked, not the whole module: a swap
        # of tokens cannot change how the code outside that statement parses.
        first, last = next(((a, b) for _, a, b in spans if a <= row <= b), (1, len(text_lines)))
        try:
            _parse_block(text_lines[first - 1 : last])
        except SyntaxError:  # an `elif` is an `if` of its own, which cannot start a block
            first, last = 1, len(text_lines)
        snippet = "\n".join(text_lines[first - 1 : last]) + "\n"
        inside = Mutant(path, row - first + 1, start, end, replacement, mutant.original_line)
        try:
            _parse_block(apply_mutant(snippet, inside).splitlines())
        except SyntaxError:
            continue
        found.setdefault((row, start, end, replacement), mutant)
    return [found[key] for key in sorted(found)]


def _parse_block(lines: list[str]) -> ast.AST:
    """Parse the lines of one statement, wherever it was indented."""
    text = "\n".join(lines) + "\n"
    return ast.parse("if True:\n" + text if text[:1].isspace() else text)


def apply_mutant(source: str, mutant: Mutant) -> str:
    r"""`source` with `mutant`'s line replaced by its mutated line (line endings kept).

    Args:
        source: the module's current text.
        mutant: a mutant generated from that text.

    Raises:
        ValueError: the source's line differs from the one the mutant was made from.

    Examples:
        >>> m = mutants_of_source("x = 1 + 2\n", "m.py")[0]
        >>> apply_mutant("x = 1 + 2\n", m)
        'x = 2 + 2\n'
    """
    lines = source.splitlines(keepends=True)
    current = lines[mutant.line - 1] if mutant.line <= len(lines) else ""
    body = current.rstrip("\r\n")
    if body != mutant.original_line:
        raise ValueError(
            f"{mutant.path}:{mutant.line} changed since its mutants were made: expected "
            f"{mutant.original_line!r}, found {body!r}; generate the mutants again."
        )
    lines[mutant.line - 1] = mutant.mutated_line + current[len(body) :]
    return "".join(lines)


def parse_diff(diff: str) -> dict[str, set[int]]:
    r"""`{path: added or changed line numbers}` of a `git diff --unified=0` output.

    Args:
        diff: the diff's text; deleted files and pure deletions contribute no lines.

    Examples:
        >>> diff = "+++ b/gradtx/a.py\n@@ -3,0 +4,2 @@\n+x\n+y\n@@ -9 +11 @@\n-z\n+w\n"
        >>> sorted(parse_diff(diff)["gradtx/a.py"])
        [4, 5, 11]
    """
    changed: dict[str, set[int]] = {}
    current: set[int] | None = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            name = line[4:].strip()
            current = None if name == "/dev/null" else changed.setdefault(name[2:], set())
        elif line.startswith("@@ ") and current is not None:
            match = re.match(r"@@ -\S+ \+(\d+)(?:,(\d+))? @@", line)
            if match:
                first, count = int(match.group(1)), int(match.group(2) or 1)
                current.update(range(first, first + count))
    return {path: rows for path, rows in changed.items() if rows}


def select(mutants: Sequence[Mutant], limit: int | None, seed: int) -> list[Mutant]:
    """At most `limit` of `mutants`, drawn at random with `seed`, in their original order.

    Args:
        mutants: the candidates.
        limit: how many to keep (all when None or when there are fewer).
        seed: the seed of the draw, so that a run can be repeated.

    Examples:
        >>> select(list("abcdef"), 3, seed=0) == select(list("abcdef"), 3, seed=0)
        True
    """
    if limit is None or limit >= len(mutants):
        return list(mutants)
    keep = set(random.Random(seed).sample(range(len(mutants)), limit))
    return [m for i, m in enumerate(mutants) if i in keep]


# --- finding the mutation sites ----------------------------------------------------------------


def _tokens(source: str) -> list[tokenize.TokenInfo]:
    return [
        tok
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type not in _SKIPPED_TOKENS
    ]


def _is_text(node: ast.AST) -> bool:
    return isinstance(node, ast.JoinedStr) or (
        isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes))
    )


def _is_message_call(node: ast.Call) -> bool:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id in ("print", "warn")
    if isinstance(func, ast.Attribute) and func.attr in MESSAGE_CALLS:
        owner = func.value
        return isinstance(owner, ast.Name) and owner.id in MESSAGE_OWNERS
    return False


class _Finder(ast.NodeVisitor):
    """Collects `(row, start, end, replacement)` edits, in characters, on one line each."""

    def __init__(self, lines: list[str], tokens: list[tokenize.TokenInfo]) -> None:
        self.lines, self.tokens = lines, tokens
        self.starts = [tok.start for tok in tokens]
        self.edits: list[tuple[int, int, int, str]] = []

    # Positions: the AST counts columns in UTF-8 bytes, tokenize in characters.
    def _char(self, row: int, byte_col: int) -> tuple[int, int]:
        return row, len(self.lines[row - 1].encode()[:byte_col].decode(errors="ignore"))

    def _start(self, node: ast.AST) -> tuple[int, int]:
        return self._char(node.lineno, node.col_offset)

    def _end(self, node: ast.AST) -> tuple[int, int]:
        return self._char(node.end_lineno, node.end_col_offset)

    def _between(
        self, a: tuple[int, int], b: tuple[int, int], parens: bool = False
    ) -> list[tokenize.TokenInfo]:
        """The tokens from `a` to `b`, less the parentheses around operands unless `parens`."""
        i = bisect.bisect_left(self.starts, a)
        out = []
        while i < len(self.tokens) and self.tokens[i].end <= b:
            if parens or self.tokens[i].string not in ("(", ")"):
                out.append(self.tokens[i])
            i += 1
        return out

    def _swap(self, a: tuple[int, int], b: tuple[int, int], table: dict[str, str]) -> None:
        """Swap the operator written between positions `a` and `b`, if it sits on one line."""
        ops = self._between(a, b)
        if not ops or ops[0].start[0] != ops[-1].end[0]:
            return
        text = " ".join(tok.string for tok in ops)
        if text in table:
            self.edits.append((ops[0].start[0], ops[0].start[1], ops[-1].end[1], table[text]))

    def _drop_prefix(self, node: ast.UnaryOp) -> None:
        """Remove a unary operator and the space after it: `not x` -> `x`, `-x` -> `x`."""
        ops = self._between(self._start(node), self._start(node.operand))
        if not ops:
            return
        row, col = ops[0].start
        following = self._between(ops[0].end, self._end(node), parens=True)
        if following and following[0].start[0] == row:
            self.edits.append((row, col, following[0].start[1], ""))

    def _replace_node(self, node: ast.AST, replacement: str) -> None:
        if node.lineno == node.end_lineno:
            (row, start), (_, end) = self._start(node), self._end(node)
            self.edits.append((row, start, end, replacement))

    # --- what is left alone
    def visit_Raise(self, node: ast.Raise) -> None:
        """An exception and its message: changing them changes only what people read."""

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        """f-strings are text for people."""

    def visit_Assert(self, node: ast.Assert) -> None:
        self.visit(node.test)  # the message is left alone

    def visit_arg(self, node: ast.arg) -> None:
        """Parameters: their annotations are not code that runs."""

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.visit(node.target)
        if node.value is not None:
            self.visit(node.value)

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        if node.name in ("__repr__", "__str__"):
            return
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)
        for part in [*node.decorator_list, *node.body]:
            self.visit(part)

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function

    # --- what is mutated
    def visit_Call(self, node: ast.Call) -> None:
        if _is_message_call(node):
            return
        func = node.func
        if isinstance(func, ast.Name) and func.id in CALL_SWAPS:
            self._replace_node(func, CALL_SWAPS[func.id])
        elif isinstance(func, ast.Attribute) and func.attr in CALL_SWAPS:
            row, end = self._end(func)
            self.edits.append((row, end - len(func.attr), end, CALL_SWAPS[func.attr]))
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        left = node.left
        for right in node.comparators:
            self._swap(self._end(left), self._start(right), COMPARE_SWAPS)
            left = right
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        containers = (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.ListComp)
        operands = (node.left, node.right)
        if not any(_is_text(x) or isinstance(x, containers) for x in operands):
            self._swap(self._end(node.left), self._start(node.right), BINARY_SWAPS)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if not _is_text(node.value):
            self._swap(self._end(node.target), self._start(node.value), AUGMENTED_SWAPS)
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        for left, right in zip(node.values, node.values[1:]):
            self._swap(self._end(left), self._start(right), BOOLEAN_SWAPS)
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, (ast.Not, ast.USub)):
            self._drop_prefix(node)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, bool):
            self._replace_node(node, str(not node.value))
        elif isinstance(node.value, int) and 0 <= node.value <= SMALL_INT:
            self._replace_node(node, str(node.value + 1))


# --- choosing the lines ------------------------------------------------------------------------


def _git(*args: str) -> str:
    result = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    if result.returncode != 0:
        raise UsageError(f"`git {' '.join(args)}` failed: {result.stderr.strip()}")
    return result.stdout


def _relative(name: str) -> str:
    """A path given on the command line, relative to the repository root."""
    path = Path(name).resolve()
    try:
        return path.relative_to(ROOT).as_posix()
    except ValueError:
        raise UsageError(f"{name!r} lies outside the repository {ROOT}.") from None


def _python_files(names: Sequence[str]) -> list[str]:
    """The `.py` files of `--paths` (a folder stands for the `.py` files under it)."""
    files = []
    for name in names:
        path = ROOT / _relative(name)
        if path.is_dir():
            files += sorted(_relative(str(p)) for p in path.rglob("*.py"))
        elif path.suffix == ".py" and path.is_file():
            files.append(_relative(name))
        else:
            raise UsageError(
                f"--paths: {name!r} is neither a .py file nor a folder; give modules such as "
                "gradtx/_schedules/decays.py."
            )
    return files


def lines_to_mutate(base: str | None, paths: Sequence[str] | None) -> dict[str, set[int] | None]:
    """`{module: its lines to mutate}`, None meaning every line.

    With `base` only: the lines of `gradtx/**.py` changed since that revision (the working
    tree against it, new untracked modules whole). With `paths` only: every line of them.
    With both: the changed lines of those paths.

    Args:
        base: a git revision, or None.
        paths: files or folders, or None.

    Raises:
        UsageError: neither is given, the revision is unknown or a path is not a module.
    """
    if base is None and not paths:
        raise UsageError("give --base REV (the lines changed since REV) or --paths FILE...")
    files = _python_files(paths) if paths else None
    if base is None:
        return dict.fromkeys(files or [])
    if not _git("rev-parse", "--verify", "--quiet", f"{base}^{{commit}}").strip():
        raise UsageError(f"--base: {base!r} names no commit; give a branch, tag or hash.")
    spec = files or ["gradtx"]
    diff = _git("diff", "--unified=0", "--no-color", "--no-ext-diff", base, "--", *spec)
    out: dict[str, set[int] | None] = {}
    for path, rows in parse_diff(diff).items():
        if path.endswith(".py"):
            out[path] = rows
    untracked = _git("ls-files", "--others", "--exclude-standard", "--", *spec).split()
    out.update((path, None) for path in untracked if path.endswith(".py"))
    return out


def collect(targets: dict[str, set[int] | None]) -> list[Mutant]:
    """The mutants of every module of `targets`, on its chosen lines."""
    mutants = []
    for path, rows in sorted(targets.items()):
        source = (ROOT / path).read_text()
        try:
            mutants += mutants_of_source(source, path, rows)
        except SyntaxError as error:
            raise UsageError(f"{path} does not parse ({error}); fix it first.") from None
    return mutants


# --- running the tests -------------------------------------------------------------------------


@dataclass
class Outcome:
    """How the tests ended on one mutant: `killed`, `timeout` or `survived`."""

    mutant: Mutant | None
    status: str
    seconds: float
    output: str = ""


class Runner:
    """Runs pytest in copies of the working tree, one copy per job."""

    def __init__(self, workspace: Path, tests: Sequence[str], jobs: int) -> None:
        files = _git("ls-files", "-z", "--cached", "--others", "--exclude-standard").split("\0")
        self.copies: Queue[Path] = Queue()
        for j in range(jobs):
            copy = workspace / f"tree-{j}"
            for name in filter(None, files):
                source = ROOT / name
                if source.is_file():
                    (copy / name).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(source, copy / name, follow_symlinks=False)
            self.copies.put(copy)
        self.tests, self.jobs = list(tests), jobs
        # Programs the mutant leaves unchanged are read back instead of compiled again; a
        # changed program has another key, so it is compiled.
        self.cache = workspace / "xla-cache"
        self.cache.mkdir()
        self.active: set[subprocess.Popen] = set()
        self.lock = threading.Lock()
        self.stopping = False

    def _env(self, copy: Path) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(copy), env.get("PYTHONPATH")]))
        # A stale .pyc of the unmutated module could be loaded: a swap such as `<` for `>`
        # keeps the file's size, and its timestamp may fall in the same second.
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env["GRADTX_TEST_COMPILATION_CACHE"] = str(self.cache)
        return env

    def check_import(self) -> None:
        """Raise unless the copy's `gradtx` is the one its tests import."""
        copy = self.copies.get()
        try:
            code = "import gradtx; print(gradtx.__file__)"
            found = subprocess.run(
                [sys.executable, "-c", code], cwd=copy, env=self._env(copy),
                capture_output=True, text=True,
            ).stdout.strip()  # fmt: skip
        finally:
            self.copies.put(copy)
        if not found.startswith(str(copy)):
            raise UsageError(
                f"the tests would import gradtx from {found or 'nowhere'}, not from the copy; "
                "run the tool with the project's .venv/bin/python."
            )

    def run(self, mutant: Mutant | None, timeout: float | None) -> Outcome:
        """Plant `mutant` (None: none) in a free copy, run the tests, restore the copy."""
        copy = self.copies.get()
        target = None if mutant is None else copy / mutant.path
        original = None if target is None else target.read_text()
        try:
            if mutant is not None:
                target.write_text(apply_mutant(original, mutant))
            return self._pytest(copy, mutant, timeout)
        finally:
            if target is not None:
                target.write_text(original)
            self.copies.put(copy)

    def _pytest(self, copy: Path, mutant: Mutant | None, timeout: float | None) -> Outcome:
        command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
        began = time.monotonic()
        with self.lock:
            if self.stopping:
                return Outcome(mutant, "skipped", 0.0)
            process = subprocess.Popen(
                [*command, *self.tests], cwd=copy, env=self._env(copy), text=True,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            self.active.add(process)
        try:
            output, _ = process.communicate(timeout=timeout)
            status = "survived" if process.returncode == 0 else "killed"
        except subprocess.TimeoutExpired:
            _kill(process)
            output, _ = process.communicate()
            status = "timeout"
        except BaseException:  # an interrupt: the run is a session of its own, end it too
            _kill(process)
            raise
        finally:
            with self.lock:
                self.active.discard(process)
        return Outcome(mutant, status, time.monotonic() - began, output or "")

    def stop(self) -> None:
        """End the test runs under way (each its own process group) and start no more."""
        with self.lock:
            self.stopping = True
            for process in list(self.active):
                _kill(process)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)  # the session the run was started in
    except ProcessLookupError:
        pass


def _summary(outcomes: Sequence[Outcome]) -> Iterator[str]:
    killed = [o for o in outcomes if o.status == "killed"]
    timed_out = [o for o in outcomes if o.status == "timeout"]
    survivors = [o for o in outcomes if o.status == "survived"]
    if survivors:
        yield f"\n{len(survivors)} survivor(s), bugs the tests did not catch:"
        yield from (f"  {o.mutant.describe()}" for o in survivors)
    done = len(killed) + len(timed_out) + len(survivors)
    if not done:
        yield "\nno mutant ran to its end."
        return
    caught = len(killed) + len(timed_out)
    rate = 100.0 * caught / done
    yield (
        f"\nkilled {caught} of {done} mutants ({rate:.0f}%): {len(killed)} by a failing "
        f"test, {len(timed_out)} by the timeout; {len(survivors)} survived."
    )


def _test_spec(spec: str) -> str:
    """A `--tests` entry (a file or folder, maybe with `::test`), relative to the root."""
    name, sep, rest = spec.partition("::")
    if not Path(name).exists():
        raise UsageError(f"--tests: no such test file or folder: {name!r}.")
    return _relative(name) + sep + rest


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tools/plant_bugs.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Aim for 90%% or more on the modules a change touched.",
    )
    parser.add_argument("--base", help="mutate the lines of gradtx/**.py changed since REV")
    parser.add_argument("--paths", nargs="+", help="mutate these modules (all their lines)")
    parser.add_argument("--tests", nargs="+", help="the pytest paths to run per mutant")
    parser.add_argument("--max", type=int, help="run at most N mutants, drawn at random")
    parser.add_argument("--seed", type=int, default=0, help="seed of that draw (default 0)")
    parser.add_argument(
        "--timeout", type=float, help="seconds per mutant (default: 3x the clean run, >= 60)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="test runs at once (default 1)")
    parser.add_argument("--list", action="store_true", help="list the mutants, run nothing")
    return parser


def _run_all(
    runner: Runner, mutants: Sequence[Mutant], timeout: float | None, outcomes: list[Outcome]
) -> None:
    """Check the clean run, then run every mutant, appending to `outcomes` as they end."""
    runner.check_import()
    clean = runner.run(None, None)
    if clean.status != "survived":
        print(clean.output[-3000:], file=sys.stderr)
        raise UsageError(
            f"the tests fail without any planted bug ({' '.join(runner.tests)}); make them "
            "pass, or choose --tests that cover the code and pass."
        )
    timeout = timeout or max(60.0, 3 * clean.seconds)
    print(
        f"{len(mutants)} mutant(s); the clean run took {clean.seconds:.0f} s, "
        f"timeout {timeout:.0f} s per mutant.",
        flush=True,
    )
    with ThreadPoolExecutor(max_workers=runner.jobs) as pool:
        try:
            futures = [pool.submit(runner.run, m, timeout) for m in mutants]
            for i, future in enumerate(futures, 1):
                outcome = future.result()
                outcomes.append(outcome)
                status = f"{outcome.status:<8} {outcome.seconds:4.0f} s"
                print(f"[{i}/{len(mutants)}] {status}  {outcome.mutant.describe()}", flush=True)
        except BaseException:
            runner.stop()  # the queued mutants are skipped, the running ones ended
            raise


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (0 whatever the kill rate).

    Args:
        argv: the arguments (default: `sys.argv[1:]`).
    """
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        for name, value, low in (("--max", args.max, 1), ("--jobs", args.jobs, 1)):
            if value is not None and value < low:
                raise UsageError(f"{name} must be at least {low}, got {value}.")
        if args.timeout is not None and args.timeout <= 0:
            raise UsageError(f"--timeout must be a positive number of seconds, got {args.timeout}.")
        if not args.list:
            if not args.tests:
                raise UsageError("give --tests: the test files or folders that cover the code.")
            tests = [_test_spec(t) for t in args.tests]
        mutants = select(collect(lines_to_mutate(args.base, args.paths)), args.max, args.seed)
    except UsageError as error:
        parser.error(str(error))
    if args.list or not mutants:
        for mutant in mutants:
            print(mutant.describe())
        print(f"{len(mutants)} mutant(s)" + ("." if mutants else ": nothing to mutate there."))
        return 0
    outcomes: list[Outcome] = []
    signal.signal(signal.SIGTERM, _interrupt)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started in the background
        signal.signal(signal.SIGINT, _interrupt)
    with tempfile.TemporaryDirectory(prefix="plant-bugs-") as workspace:
        runner = Runner(Path(workspace), tests, args.jobs)
        try:
            _run_all(runner, mutants, args.timeout, outcomes)
        except UsageError as error:
            parser.error(str(error))
        except KeyboardInterrupt:
            # The runs are sessions of their own, which the terminal's interrupt misses.
            runner.stop()
            print("\ninterrupted; the results so far:", flush=True)
    for line in _summary(outcomes):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
