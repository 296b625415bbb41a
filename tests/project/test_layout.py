"""The package's layout is its architecture: layer folders that import downward, no cycles.

docs/architecture.md draws the same layers; a move that breaks them fails here first.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import gradtx

PACKAGE = Path(gradtx.__file__).parent
ROOT = Path(__file__).resolve().parents[2]  # the repository

# Each folder may import from folders of a lower rank (and from itself), never upward.
RANKS = {
    "_paths": 1,
    "_layouts": 2,
    "_core": 3,
    "_tree": 4,
    "_optax": 4,
    "_schedules": 5,
    "_transforms": 5,
    "_projections": 5,
    "_combinators": 6,
    "_optimizers": 7,
    "_state": 8,
    "contrib": 9,
    "(face)": 10,  # gradtx/__init__.py and the public namespaces paths, schedules, tree
}
LEFTOVER_WORDS = ("misc", "more", "util", "helper", "other", "extra", "common")

# Every public name, sorted: moving a module must not add, drop or rename any of them.
PUBLIC_NAMES = """
gradtx.LoadReport gradtx.Packed gradtx.RestoreReport gradtx.SlotLayout gradtx.StateMismatchError
gradtx.Transformation
gradtx.accumulate gradtx.adabelief gradtx.adadelta gradtx.adafactor gradtx.adagrad gradtx.adam
gradtx.adamax gradtx.adamaxw gradtx.adamw gradtx.adan gradtx.adaptive_grad_clip
gradtx.add_decayed_weights gradtx.add_noise gradtx.amsgrad gradtx.apply_every gradtx.apply_if_finite
gradtx.apply_updates gradtx.bucketed gradtx.centralize gradtx.chain gradtx.clip
gradtx.clip_by_block_rms gradtx.clip_by_global_norm gradtx.conditionally_mask
gradtx.conditionally_transform gradtx.contrib gradtx.contrib.GaLoreDimensionNumbers
gradtx.contrib.acprop
gradtx.contrib.ademamix gradtx.contrib.adopt
gradtx.contrib.cocob gradtx.contrib.dadapt_adamw
gradtx.contrib.differentially_private_aggregate gradtx.contrib.dog gradtx.contrib.dowg
gradtx.contrib.dpsgd gradtx.contrib.galore gradtx.contrib.hutchinson_estimator_diag_hessian
gradtx.contrib.madgrad gradtx.contrib.mechanize gradtx.contrib.momo gradtx.contrib.momo_adam
gradtx.contrib.muon gradtx.contrib.normalize
gradtx.contrib.orthogonalize_via_newton_schulz gradtx.contrib.prodigy
gradtx.contrib.reduce_on_plateau
gradtx.contrib.sam gradtx.contrib.scale_by_acprop
gradtx.contrib.scale_by_ademamix gradtx.contrib.scale_by_adopt
gradtx.contrib.scale_by_cocob gradtx.contrib.scale_by_dog gradtx.contrib.scale_by_dowg
gradtx.contrib.scale_by_galore gradtx.contrib.scale_by_madgrad
gradtx.contrib.scale_by_muon gradtx.contrib.scale_by_simplified_ademamix
gradtx.contrib.scale_by_sophia gradtx.contrib.simplified_ademamix gradtx.contrib.sophia
gradtx.contrib.split_real_and_imaginary
gradtx.ema gradtx.ema_params gradtx.eval_params gradtx.explain
gradtx.freeze gradtx.from_optax gradtx.fromage
gradtx.global_norm gradtx.has_updated gradtx.hyperparams gradtx.identity
gradtx.incremental_update gradtx.inject_hyperparams
gradtx.keep_params_nonnegative gradtx.lamb gradtx.lars gradtx.lbfgs gradtx.lion
gradtx.load_state_dict
gradtx.lookahead gradtx.masked gradtx.monitor gradtx.multi_steps gradtx.multi_transform gradtx.nadam
gradtx.nadamw gradtx.named_chain gradtx.nesterov gradtx.noisy_sgd
gradtx.normalize_by_update_norm gradtx.novograd gradtx.optimistic_adam
gradtx.optimistic_gradient_descent gradtx.pack
gradtx.partition gradtx.paths gradtx.paths.DuplicatePathError gradtx.paths.LabelError
gradtx.paths.Selector gradtx.paths.SelectorError gradtx.paths.as_selector gradtx.paths.flatten
gradtx.paths.leaves gradtx.paths.paths gradtx.paths.resolve_labels gradtx.paths.select
gradtx.paths.unflatten gradtx.per_example_global_norm_clip gradtx.per_example_layer_norm_clip
gradtx.periodic_update
gradtx.polyak_sgd gradtx.projections gradtx.projections.projection_box
gradtx.projections.projection_halfspace gradtx.projections.projection_hypercube
gradtx.projections.projection_hyperplane gradtx.projections.projection_l1_ball
gradtx.projections.projection_l1_sphere gradtx.projections.projection_l2_ball
gradtx.projections.projection_l2_sphere gradtx.projections.projection_linf_ball
gradtx.projections.projection_non_negative gradtx.projections.projection_simplex
gradtx.projections.projection_vector gradtx.radam
gradtx.reconcile gradtx.reset gradtx.restore gradtx.rmsprop gradtx.rprop gradtx.save
gradtx.scale gradtx.scale_by_adadelta
gradtx.scale_by_adam gradtx.scale_by_adamax gradtx.scale_by_adan gradtx.scale_by_amsgrad
gradtx.scale_by_backtracking_linesearch
gradtx.scale_by_belief gradtx.scale_by_distance_over_gradients
gradtx.scale_by_factored_rms gradtx.scale_by_lbfgs gradtx.scale_by_learning_rate
gradtx.scale_by_lion gradtx.scale_by_novograd gradtx.scale_by_optimistic_gradient
gradtx.scale_by_param_block_norm
gradtx.scale_by_param_block_rms gradtx.scale_by_polyak gradtx.scale_by_radam gradtx.scale_by_rms
gradtx.scale_by_rprop gradtx.scale_by_rss gradtx.scale_by_schedule gradtx.scale_by_sign
gradtx.scale_by_sm3
gradtx.scale_by_stddev gradtx.scale_by_trust_ratio gradtx.scale_by_yogi
gradtx.scale_by_zoom_linesearch gradtx.scale_gradient
gradtx.schedule_free gradtx.schedule_free_adamw gradtx.schedule_free_sgd
gradtx.schedules gradtx.schedules.Schedule gradtx.schedules.StatefulSchedule
gradtx.schedules.WrappedSchedule gradtx.schedules.constant
gradtx.schedules.cosine_decay gradtx.schedules.cosine_onecycle
gradtx.schedules.exponential_decay gradtx.schedules.join gradtx.schedules.linear
gradtx.schedules.linear_onecycle gradtx.schedules.piecewise_constant
gradtx.schedules.piecewise_interpolate gradtx.schedules.polynomial gradtx.schedules.sgdr
gradtx.schedules.warmup_constant gradtx.schedules.warmup_cosine_decay
gradtx.schedules.warmup_exponential_decay gradtx.selective_transform gradtx.set_hyperparams
gradtx.set_to_zero gradtx.sgd gradtx.sign_sgd gradtx.signum
gradtx.skip_large_updates gradtx.skip_not_finite gradtx.slot_layouts gradtx.sm3
gradtx.state_dict
gradtx.state_shardings gradtx.stateless gradtx.stateless_with_tree_map gradtx.stats
gradtx.trace
gradtx.trainable gradtx.tree gradtx.tree.add gradtx.tree.add_scale gradtx.tree.allclose
gradtx.tree.cast gradtx.tree.cast_like gradtx.tree.clip gradtx.tree.div gradtx.tree.full_like
gradtx.tree.get gradtx.tree.map_with_path gradtx.tree.max gradtx.tree.min gradtx.tree.mul
gradtx.tree.norm gradtx.tree.ones_like gradtx.tree.scale gradtx.tree.set gradtx.tree.size
gradtx.tree.sub gradtx.tree.sum gradtx.tree.vdot gradtx.tree.where gradtx.tree.zeros_like
gradtx.tree_map_params
gradtx.unitwise_clip gradtx.unitwise_norm gradtx.value_and_grad_from_state gradtx.without_statistics
gradtx.yogi
gradtx.zero_nans
""".split()


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    """`{dotted module name: file}` for every module of the package."""
    out = {}
    for file in package.rglob("*.py"):
        parts = file.relative_to(package.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = file
    return out


def import_edges(modules: dict[str, Path]) -> set[tuple[str, str]]:
    """(importer, imported) for every import of a package module, lazy ones inside functions too."""
    edges = set()
    for name, file in modules.items():
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    submodule = f"{node.module}.{alias.name}"
                    target = submodule if submodule in modules else node.module
                    if target in modules:
                        edges.add((name, target))
            elif isinstance(node, ast.Import):
                edges.update((name, a.name) for a in node.names if a.name in modules)
    return edges


def find_cycle(edges: set[tuple[str, str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def folder(module: str) -> str:
    """The layer folder of a module (`gradtx._core.lift` -> `_core`); `(face)` at the top."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or parts[1:] == ["contrib"] else "(face)"


def upward_imports(edges: set[tuple[str, str]]) -> list[str]:
    """Imports from a folder of the same or a higher rank than the importer's (other folders)."""
    return sorted(
        f"{a} imports {b}"
        for a, b in edges
        if folder(a) != folder(b) and RANKS[folder(b)] >= RANKS[folder(a)]
    )


def test_public_names_are_unchanged():
    names = [f"gradtx.{n}" for n in gradtx.__all__]
    for namespace in ("paths", "projections", "schedules", "tree", "contrib"):
        module = getattr(gradtx, namespace)
        names += [f"gradtx.{namespace}.{n}" for n in module.__all__]
    assert sorted(names) == PUBLIC_NAMES
    for name in names:  # each is really there, not only listed
        module, _, attr = name.rpartition(".")
        assert hasattr(eval(module, {"gradtx": gradtx}), attr), name


def test_every_module_sits_in_a_known_layer():
    unknown = sorted(m for m in _modules() if folder(m) not in RANKS)
    assert not unknown, f"modules outside the layer folders of RANKS: {unknown}"


def test_at_most_a_dozen_files_at_the_top():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= 12, top


def test_no_module_is_named_for_being_a_leftover():
    bad = [m for m in _modules() if any(w in m.rsplit(".", 1)[-1] for w in LEFTOVER_WORDS)]
    assert not bad, f"name these modules for what they hold: {bad}"


# Test and benchmark files are named for what they check or measure: a name that says when a
# file was written, or that it holds what fit nowhere else, tells a reader nothing.
WHEN_WRITTEN_WORDS = ("two", "three", "round", "findings", "new", "old")
NAMED_FOR_WHAT_THEY_CHECK = ("tests", "benchmarks")


def named_for_a_leftover(name: str) -> bool:
    """Whether a file or folder name has a leftover or when-written word among its parts (split
    at `_`, `-` and `.`; a plural counts), so that `test_multi_steps_options` passes."""
    words = set(LEFTOVER_WORDS + WHEN_WRITTEN_WORDS)
    parts = re.split(r"[_.\-]", name.lower())
    return any(part in words or part.removesuffix("s") in words for part in parts)


def leftover_names(root: Path) -> list[str]:
    """The files and folders under `root`'s test and benchmark folders named for a leftover."""
    return sorted(
        str(path.relative_to(root))
        for folder in NAMED_FOR_WHAT_THEY_CHECK
        for path in (root / folder).rglob("*")
        if not any(p.startswith(".") or p == "__pycache__" for p in path.relative_to(root).parts)
        and named_for_a_leftover(path.name)
    )


def test_the_name_check_sees_leftover_and_when_written_words():
    flagged = [
        "registry_contrib_two.py", "references_misc.py", "registry_helpers.py", "tree_utils",
        "test_catalogue_round_two.py", "test_optax_suite_findings.py", "extras", "old-runs.json",
    ]  # fmt: skip
    passing = [
        "test_multi_steps_options.py", "test_warmups_and_cycles.py", "threshold.py",
        "test_grounded.py", "__init__.py", "h100.txtpb",
    ]  # fmt: skip
    assert [n for n in flagged if not named_for_a_leftover(n)] == []
    assert [n for n in passing if named_for_a_leftover(n)] == []


def test_no_test_or_benchmark_is_named_for_being_a_leftover():
    bad = leftover_names(ROOT)
    assert not bad, f"name these for what they check or measure: {bad}"


def test_no_import_cycle():
    cycle = find_cycle(import_edges(_modules()))
    assert cycle is None, " -> ".join(cycle)


def test_layers_import_only_downward():
    assert upward_imports(import_edges(_modules())) == []


def test_the_checks_see_a_cycle_and_an_upward_import(tmp_path):
    # Guard against vacuous checks: a lazy import that closes a loop and crosses layers.
    package = tmp_path / "gradtx"
    (package / "_core").mkdir(parents=True)
    (package / "_paths").mkdir()
    (package / "__init__.py").write_text("")
    (package / "_core" / "lift.py").write_text("from gradtx._paths.paths import flatten\n")
    (package / "_paths" / "paths.py").write_text(
        "def flatten():\n    from gradtx._core import lift\n"
    )
    edges = import_edges(_modules(package))
    assert find_cycle(edges) in (
        ["gradtx._core.lift", "gradtx._paths.paths", "gradtx._core.lift"],
        ["gradtx._paths.paths", "gradtx._core.lift", "gradtx._paths.paths"],
    )
    assert upward_imports(edges) == ["gradtx._paths.paths imports gradtx._core.lift"]


@pytest.mark.parametrize("layer", sorted(set(RANKS) - {"(face)", "contrib"}))
def test_each_layer_folder_says_what_it_holds(layer):
    doc = ast.get_docstring(ast.parse((PACKAGE / layer / "__init__.py").read_text()))
    assert doc, f"gradtx/{layer}/__init__.py needs a docstring naming what the folder holds"


def test_the_architecture_page_draws_and_names_every_folder():
    page = (ROOT / "docs" / "architecture.md").read_text()
    assert "```mermaid" in page
    folders = sorted(set(RANKS) - {"(face)"})
    missing = [f for f in folders if f"`{f}/`" not in page or f"<b>{f}</b>" not in page]
    assert not missing, f"docs/architecture.md neither draws nor describes: {missing}"


# A time (`3 ms`, `40 us`, `0.25 s`, `12 s`) or a ratio to optax (`1.2x optax's`): a
# measurement, which belongs to the benchmarks' results; a comment says why in a clause and
# names the benchmark instead. (`1s`, ones, is no time.)
TIMING = re.compile(
    r"\b\d+(?:\.\d+)?\s?(?:ms|µs|us)\b|\b\d+\.\d+\s?s\b|\b\d+ s\b"
    r"|\b\d+(?:\.\d+)?x\s(?:optax|faster|slower)"
)


def _prose(source: str) -> list[tuple[int, str]]:
    """The comments and docstrings of a module, with their first line numbers."""
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                found.append((node.body[0].lineno, doc))
    return found


def timing_figures(source: str) -> list[tuple[int, str]]:
    """`(line, match)` for each timing figure in the comments and docstrings of `source`."""
    return [(line, m.group()) for line, text in _prose(source) for m in TIMING.finditer(text)]


def test_the_timing_check_sees_figures_in_comments_and_docstrings_only():
    source = (
        '"""Traced in 0.25 s instead of 12 s; 40us a leaf."""\n'
        "x = 1  # 1.2x optax's step time, 3x faster\n"
        'message = f"took {t:.1f} ms"  # a message, not a comment: 5 ms\n'
        "# three ones (1s), 2 samples and 64 x 64 floats are no timing\n"
    )
    found = sorted(m for _, m in timing_figures(source))
    assert found == ["0.25 s", "1.2x optax", "12 s", "3x faster", "40us", "5 ms"], found


def test_no_timing_figures_in_code_comments_or_docstrings():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {match!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, match in timing_figures(path.read_text())
    ]
    assert not found, (
        "timing figures belong in the benchmarks' results; say why in a clause and name the "
        "benchmark instead:\n" + "\n".join(found)
    )
