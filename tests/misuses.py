"""The catalogue of misuses users hit, each with the error (or warning) gradtx answers with.

`tests/test_misuse.py` runs every case, and checks that the table on the docs page
`docs/misuse.md` is the one `render()` makes from the messages the cases really raise, so the
page and the messages cannot drift apart. Regenerate the page's table after changing a
message:

    python tests/misuses.py
"""

from __future__ import annotations

import dataclasses
import re
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import gradtx  # noqa: E402

PAGE = ROOT / "docs" / "misuse.md"
START, END = "<!-- misuse-table:start -->", "<!-- misuse-table:end -->"


@dataclasses.dataclass(frozen=True)
class Misuse:
    """One mistake: what the user passed, and what gradtx says (a regex of the message)."""

    id: str
    passed: str
    run: Callable[[], Any]
    error: type[BaseException] | type[Warning]
    match: str


def _params() -> dict:
    return {"enc": {"w": jnp.ones((2, 3)), "b": jnp.zeros(3)}, "head": {"w": jnp.ones(3)}}


def _grads() -> dict:
    return jax.tree.map(lambda p: p * 0.5 + 0.1, _params())


def _step(tx: Any, grads: Any, params: Any = None, state: Any = None) -> Any:
    params = _params() if params is None else params
    state = tx.init(params) if state is None else state
    return tx.update(grads, state, params)


def _missing_leaf() -> Any:
    grads = _grads()
    del grads["enc"]["b"]
    return _step(gradtx.adam(1e-3), grads)


def _renamed_key() -> Any:
    grads = _grads()
    grads["enc"]["wx"] = grads["enc"].pop("w")
    return _step(gradtx.adam(1e-3), grads)


def _extra_key() -> Any:
    grads = _grads()
    grads["enc"]["bias"] = jnp.zeros(3)
    return _step(gradtx.adam(1e-3), grads)


def _float0_grads() -> Any:
    params = {"w": jnp.ones(2), "steps": jnp.zeros((), jnp.int32)}
    grads = jax.grad(lambda p: jnp.sum(p["w"] ** 2), allow_int=True)(params)
    tx = gradtx.clip(1.0)  # stateless: `init` has no per-path state to refuse the int param
    return tx.update(grads, tx.init(params), params)


def _equinox_module() -> Any:
    import equinox as eqx

    model = eqx.nn.MLP(2, 2, 4, 1, key=jax.random.key(0))
    grads = eqx.filter_grad(lambda m: jnp.sum(m(jnp.ones(2))))(model)
    tx = gradtx.clip_by_global_norm(1.0)
    return tx.update(model, tx.init(grads), model)


def _float16_adam() -> Any:
    return gradtx.adam(1e-3).init({"w": jnp.zeros(3, jnp.float16)})


MISUSES: tuple[Misuse, ...] = (
    Misuse(
        "grads-missing-leaf",
        "gradients lacking a leaf of the params (`enc/b`)",
        _missing_leaf,
        ValueError,
        r"no entry for 1 parameter path\(s\): 'enc/b'.*partial=True",
    ),
    Misuse(
        "grads-missing-subtree",
        "gradients lacking a whole subtree (`head`)",
        lambda: _step(gradtx.adam(1e-3), {"enc": _grads()["enc"]}),
        ValueError,
        r"no entry for 1 parameter path\(s\): 'head/w'",
    ),
    Misuse(
        "grads-empty",
        "an empty gradient tree, `{}`",
        lambda: _step(gradtx.adam(1e-3), {}),
        ValueError,
        r"no entry for 3 parameter path\(s\)",
    ),
    Misuse(
        "grads-renamed-key",
        "gradients with a renamed key (`enc/wx` for `enc/w`)",
        _renamed_key,
        ValueError,
        r"'enc/w'.*A typo in the gradients' keys: 'enc/wx' instead of 'enc/w'",
    ),
    Misuse(
        "grads-extra-key",
        "gradients with an extra key (`enc/bias`)",
        _extra_key,
        KeyError,
        r"the gradients have an entry at 'enc/bias'.*the params have no parameter there",
    ),
    Misuse(
        "params-integer",
        "integer params",
        lambda: gradtx.adam(1e-3).init({"w": jnp.zeros(2), "steps": jnp.zeros(2, jnp.int32)}),
        TypeError,
        r"parameter at 'steps' has dtype int32.*freeze it",
    ),
    Misuse(
        "params-python-int",
        "a Python `int` among the params, `{'a': 1.0, 'b': 2}`",
        lambda: gradtx.adam(1e-3).init({"a": 1.0, "b": 2}),
        TypeError,
        r"parameter at 'b' has dtype int32",
    ),
    Misuse(
        "grads-float0",
        "`float0` gradients of integer params (`jax.grad(..., allow_int=True)`)",
        _float0_grads,
        TypeError,
        r"the gradient at 'steps' has dtype float0",
    ),
    Misuse(
        "params-equinox-module",
        "a whole `eqx.Module` (with its activation functions) as params",
        _equinox_module,
        TypeError,
        r"leaf at 'activation' is a custom_jvp, not an array.*eqx.filter",
    ),
    Misuse(
        "learning-rate-none",
        "`learning_rate=None`",
        lambda: gradtx.adam(None),
        TypeError,
        r"scale_by_learning_rate: `learning_rate` must be a number, an array or a schedule",
    ),
    Misuse(
        "hyperparameter-nan",
        "a NaN hyperparameter, `adam(1e-3, b2=nan)`",
        lambda: gradtx.adam(1e-3, b2=float("nan")),
        ValueError,
        r"scale_by_adam: `b2` must be finite, got nan",
    ),
    Misuse(
        "learning-rate-inf",
        "an infinite learning rate",
        lambda: gradtx.sgd(float("inf")),
        ValueError,
        r"`learning_rate` must be finite, got inf",
    ),
    Misuse(
        "decay-rate-above-one",
        "`adam(1e-3, b1=1.5)`",
        lambda: gradtx.adam(1e-3, b1=1.5),
        ValueError,
        r"scale_by_adam: `b1` must be in \[0, 1\) \(a decay rate\), got 1.5",
    ),
    Misuse(
        "negative-clip",
        "`clip_by_global_norm(-1)`",
        lambda: gradtx.clip_by_global_norm(-1.0),
        ValueError,
        r"clip_by_global_norm: `max_norm` must be >= 0 \(a negative bound flips",
    ),
    Misuse(
        "negative-eps",
        "`adam(1e-3, eps=-1e-8)`",
        lambda: gradtx.adam(1e-3, eps=-1e-8),
        ValueError,
        r"scale_by_adam: `eps` must be >= 0",
    ),
    Misuse(
        "schedule-vector",
        "a schedule returning shape `(2,)`",
        lambda: gradtx.adam(lambda step: jnp.full(2, 1e-3)).init(_params()),
        TypeError,
        r"the schedule given as `learning_rate` must return a real number per step "
        r"\(shape \(\)\), got shape \(2,\)",
    ),
    Misuse(
        "schedule-one-element",
        "a schedule returning shape `(1,)`",
        lambda: gradtx.adam(lambda step: jnp.full(1, 1e-3)).init(_params()),
        TypeError,
        r"must return a real number per step \(shape \(\)\), got shape \(1,\)",
    ),
    Misuse(
        "schedule-string",
        "a schedule returning a string",
        lambda: gradtx.sgd(lambda step: "1e-3").init(_params()),
        TypeError,
        r"must return a real number per step \(shape \(\)\), got type str",
    ),
    Misuse(
        "partition-label-without-transformation",
        '`partition({"enc": adam}, {"enc": "enc/**", "head": "head/**"})` (no `head`)',
        lambda: gradtx.partition(
            {"enc": gradtx.adam(1e-3)}, {"enc": "enc/**", "head": "head/**"}
        ).init(_params()),
        Exception,
        r"reads neither way. As `\{label: selector\}`, its keys \['head'\] have no "
        r"transformation",
    ),
    Misuse(
        "label-tree-entry-matching-nothing",
        "a label tree with an entry no parameter has (`no_decay`)",
        lambda: gradtx.partition(
            {"a": gradtx.adam(1e-3)}, {"enc": "a", "head": "a", "no_decay": "a"}
        ).init(_params()),
        Exception,
        r"the label tree's entry 'no_decay' \(label 'a'\) matches no parameter",
    ),
    Misuse(
        "float16-adam",
        "float16 params with Adam's defaults (a warning)",
        _float16_adam,
        UserWarning,
        r"float16 params at 'w' keep the second moment `nu` in float16.*nu_dtype=jnp.float32",
    ),
    Misuse(
        "load-nested-state",
        "`load_state_dict(tx, params, state)` with the nested state",
        lambda: gradtx.load_state_dict(
            gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(1e-3)),
            _params(),
            gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adamw(1e-3)).init(_params()),
        ),
        TypeError,
        r"`flat` must be flat.*Pass `gradtx.state_dict\(state\)` instead",
    ),
)


def message(case: Misuse) -> str:
    """The message `case` raises (or warns), first paragraph only."""
    if issubclass(case.error, Warning):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            case.run()
        found = [w for w in caught if issubclass(w.category, case.error)]
        if not found:
            raise AssertionError(f"{case.id}: no {case.error.__name__}")
        text = str(found[0].message)
    else:
        try:
            case.run()
        except case.error as e:
            text = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        else:
            raise AssertionError(f"{case.id}: no {case.error.__name__} raised")
    return str(text).split("\n--------------------")[0].strip()


def render() -> str:
    """The page's table: each case, what was passed, the error type and message."""
    rows = ["| mistake | what gradtx says |", "|---|---|"]
    with jax.numpy_dtype_promotion("strict"):
        for case in MISUSES:
            text = message(case)
            kind = type_name(case, text)
            shown = re.sub(r"\s+", " ", text).replace("|", "\\|")
            rows.append(f"| {case.passed} | **{kind}**: {shown} |")
    return "\n".join(rows)


def type_name(case: Misuse, text: str) -> str:
    """The class users see (`LabelError` for label mistakes, not the catalogue's `Exception`)."""
    if case.error is Exception:
        try:
            case.run()
        except Exception as e:  # noqa: BLE001 - we only read its class
            return type(e).__name__
    return case.error.__name__


def page_table(text: str) -> str:
    """The table between the page's markers."""
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def main() -> None:
    """Write the table into docs/misuse.md between its markers."""
    text = PAGE.read_text()
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    PAGE.write_text(f"{head}{START}\n{render()}\n{END}{tail}")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
