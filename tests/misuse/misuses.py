"""The catalogue of misuses users hit, each with the error (or warning) gradtx answers with.

`tests/misuse/test_misuse_catalogue.py` runs every case, and checks that the table on the docs page
`docs/misuse.md` is the one `render()` makes from the messages the cases really raise, so the
page and the messages cannot drift apart. Regenerate the page's table after changing a
message:

    python tests/misuse/misuses.py
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
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


@contextlib.contextmanager
def _in_temp_folder() -> Iterator[None]:
    """Run in a fresh temporary folder, so messages show the short file name."""
    here = os.getcwd()
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        try:
            yield
        finally:
            os.chdir(here)


def _activation(x: Any) -> Any:
    return x


def _save_function_leaf() -> Any:
    with _in_temp_folder():
        params = {**_params(), "act": _activation}
        gradtx.save("ckpt.safetensors", params, gradtx.adam(1e-3).init(_params()))


def _saved(tx: Any) -> None:
    gradtx.save("ckpt.safetensors", _params(), tx.init(_params()), tx=tx)


def _restore_into_function_leaf() -> Any:
    tx = gradtx.adam(1e-3)
    with _in_temp_folder():
        _saved(tx)
        gradtx.restore("ckpt.safetensors", tx, {**_params(), "act": _activation})


def _restore_damaged() -> Any:
    tx = gradtx.adam(1e-3)
    with _in_temp_folder():
        _saved(tx)
        data = bytearray(Path("ckpt.safetensors").read_bytes())
        data[-1] ^= 0x01  # the last byte of the last tensor
        Path("ckpt.safetensors").write_bytes(bytes(data))
        gradtx.restore("ckpt.safetensors", tx, _params())


def _restore_old_schema() -> Any:
    from gradtx._state import safetensors_format

    tx = gradtx.adam(1e-3)
    with _in_temp_folder():
        _saved(tx)
        tensors, metadata = safetensors_format.read("ckpt.safetensors")
        metadata = {**metadata, "gradtx.schema": "0"}
        safetensors_format.write("ckpt.safetensors", tensors, metadata)
        gradtx.restore("ckpt.safetensors", tx, _params())


def _restore_other_mask() -> Any:
    with _in_temp_folder():
        _saved(gradtx.adamw(1e-3, weight_decay=0.1, mask="**/w"))
        other = gradtx.adamw(1e-3, weight_decay=0.1, mask="enc/**")
        gradtx.restore("ckpt.safetensors", other, _params())


def _labels_read_two_ways() -> Any:
    params = {name: {"w": jnp.ones(2)} for name in "abc"}
    tx = gradtx.partition({n: gradtx.sgd(0.1) for n in "abc"}, {"a": "b", "b": "c", "c": "a"})
    return tx.init(params)


def _ambiguous_field() -> Any:
    tx = gradtx.partition(
        {"enc": gradtx.adam(1e-3), "head": gradtx.adam(1e-3)}, {"enc": "enc", "head": "head"}
    )
    return gradtx.tree.get(tx.init(_params()), "count")


def _float16_adafactor() -> Any:
    return gradtx.adafactor(1e-3).init({"w": jnp.zeros((3, 4), jnp.float16)})


def _muon_kernel_without_axes() -> Any:
    params = {"conv": jnp.zeros((3, 3, 4, 8)), "head": jnp.zeros((8, 2))}
    return gradtx.contrib.muon(0.02, muon_mask="**").init(params)


def _lookahead_reset_without_params() -> Any:
    tx = gradtx.lookahead(gradtx.adam(1e-3), 2, reset_state=True)
    return tx.update(_grads(), tx.init(_params()))


def _set_out_of_range() -> Any:
    tx = gradtx.inject_hyperparams(gradtx.adam)(learning_rate=1e-3)
    return gradtx.set_hyperparams(tx.init(_params()), {"b2": 1.5})


def _optax_schedule_to_number() -> Any:
    import optax

    schedule = optax.linear_schedule(1e-2, 0.0, 10)
    otx = optax.inject_hyperparams(optax.adam)(learning_rate=schedule)
    tx = gradtx.inject_hyperparams(gradtx.adam)(learning_rate=1e-2)
    return gradtx.from_optax(otx.init(_params()), tx, _params())


def _param_reshaped_since_init() -> Any:
    tx = gradtx.adam(1e-3)
    state = tx.init(_params())
    params = {**_params(), "head": {"w": jnp.ones(4)}}
    return _step(tx, params, params, state)


def _momentum_param_reshaped_since_init() -> Any:
    tx = gradtx.sgd(1e-3, momentum=0.9)
    state = tx.init(_params())
    params = {**_params(), "head": {"w": jnp.ones((3, 2))}}
    return _step(tx, params, params, state)


def _scan_partial_from_fresh_state() -> Any:
    tx = gradtx.adam(1e-3)

    def body(state: Any, _: Any) -> Any:
        return tx.update({**_grads(), "head": None}, state, _params())[1], None

    return jax.lax.scan(body, tx.init(_params()), None, length=2)


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
    Misuse(
        "mask-exclusion-matching-nothing",
        '`adamw(mask="!**/bias")` on a model whose biases are named `b`',
        lambda: gradtx.adamw(1e-3, mask="!**/bias").init(_params()),
        Exception,
        r"the glob '!\*\*/bias' excludes nothing: '\*\*/bias' matches no path",
    ),
    Misuse(
        "freeze-optax-style",
        '`gradtx.freeze("enc")`, optax\'s `freeze(mask)`',
        lambda: gradtx.freeze("enc"),
        TypeError,
        r"`inner` must be the optimizer of the trainable paths, got str 'enc'.*"
        r"`gradtx.freeze\(gradtx.adamw\(1e-3\), 'enc'\)`",
    ),
    Misuse(
        "freeze-without-where",
        "`gradtx.freeze(tx)` without a selector",
        lambda: gradtx.freeze(gradtx.adam(1e-3)),
        TypeError,
        r"`where` is missing: pass a selector of the paths to freeze",
    ),
    Misuse(
        "labels-read-two-ways",
        'a labels dict valid both ways with different labels (`{"a": "b", "b": "c", "c": "a"}`)',
        _labels_read_two_ways,
        Exception,
        r"reads two ways with different labels. As `\{label: selector\}`: 'a/w' -> 'c'",
    ),
    Misuse(
        "tree-get-ambiguous-name",
        '`gradtx.tree.get(state, "count")` where two labels each have a count',
        _ambiguous_field,
        KeyError,
        r"'count' is no path of the tree, and 2 paths end in it: 'enc/count', 'head/count'",
    ),
    Misuse(
        "set-hyperparams-out-of-range",
        "`set_hyperparams(state, {'b2': 1.5})` on an injected Adam",
        _set_out_of_range,
        ValueError,
        r"set_hyperparams: 'b2' = 1.5 is refused by adam: scale_by_adam: `b2` must be in \[0, 1\)",
    ),
    Misuse(
        "hyperparameter-nan-array",
        "a NaN given as a JAX array, `sgd(jnp.array(nan))`",
        lambda: gradtx.sgd(jnp.array(float("nan"))),
        ValueError,
        r"scale_by_learning_rate: `learning_rate` must be finite, got Array\(nan",
    ),
    Misuse(
        "hyperparameter-vector",
        "a vector learning rate outside `vmap`, `sgd(jnp.array([0.1, 10.0]))`",
        lambda: _step(gradtx.sgd(jnp.array([0.1, 10.0])), _grads()),
        ValueError,
        r"sgd: the hyperparameter `transforms\[0\].learning_rate` \(of scale_by_learning_rate\) "
        r"has shape \(2,\), but the update needs a scalar",
    ),
    Misuse(
        "injected-schedule-vector",
        "an injected schedule returning shape `(2,)`",
        lambda: gradtx.inject_hyperparams(gradtx.adam)(
            learning_rate=lambda step: jnp.full(2, 1e-3)
        ).init(_params()),
        TypeError,
        r"inject_hyperparams\(adam\): the schedule given as `learning_rate` must return a real "
        r"number per step \(shape \(\)\), got shape \(2,\)",
    ),
    Misuse(
        "inject-bf16-rounds-out-of-range",
        "`inject_hyperparams(adam, hyperparam_dtype=jnp.bfloat16)`, `b2=0.999` rounding to 1",
        lambda: gradtx.inject_hyperparams(gradtx.adam, hyperparam_dtype=jnp.bfloat16)(
            learning_rate=1e-3
        ).init(_params()),
        ValueError,
        r"`b2` must be in \[0, 1\).* In bfloat16, b2=0.999 is stored as 1; keep the "
        r"hyperparameters in float32",
    ),
    Misuse(
        "exponential-decay-zero-rate",
        "`schedules.exponential_decay(1.0, 2, decay_rate=0.0)`",
        lambda: gradtx.schedules.exponential_decay(1.0, 2, decay_rate=0.0),
        ValueError,
        r"`decay_rate` must be > 0: with 0 the value drops to 0 right after `transition_begin`.*"
        r"schedules.constant\(init_value\)",
    ),
    Misuse(
        "from-optax-schedule-to-number",
        "`from_optax` of an optax injected schedule into a gradtx injected number",
        _optax_schedule_to_number,
        ValueError,
        r"hyperparams_states\['learning_rate'\] \(WrappedScheduleState\) is the state of a "
        r"schedule; gradtx's inject_hyperparams\(adam\) has a number as 'learning_rate'",
    ),
    Misuse(
        "param-reshaped-since-init",
        "params whose shape changed since `init` (no `reconcile`)",
        _param_reshaped_since_init,
        ValueError,
        r"the gradient at 'head/w' has shape \(4,\), but the state there was made for a "
        r"parameter of another shape: its step count 'count' was made for shape \(3,\).*"
        r"gradtx\.reconcile",
    ),
    Misuse(
        "param-reshaped-momentum",
        "a reshaped parameter under momentum (no step count)",
        _momentum_param_reshaped_since_init,
        ValueError,
        r"trace: the gradient at 'head/w' has shape \(3, 2\).*its state 'trace' has shape \(3,\)"
        r".*gradtx\.reconcile",
    ),
    Misuse(
        "gradient-shape-differs",
        "a gradient shaped otherwise than its parameter",
        lambda: _step(gradtx.adam(1e-3), {**_grads(), "head": {"w": jnp.ones(4)}}),
        ValueError,
        r"at path 'head/w' the update has shape \(4,\) but the parameter has shape \(3,\)\. "
        r"Each gradient must have its parameter's shape",
    ),
    Misuse(
        "chain-state-by-position",
        "`chain(...)` state read by position, `state[0]`",
        lambda: gradtx.chain(gradtx.clip_by_global_norm(1.0), gradtx.adam(1e-3)).init(_params())[0],
        KeyError,
        r"keyed by name, not by position: its keys, in order, are "
        r"'clip_by_global_norm', 'adam' \(read one as state\['clip_by_global_norm'\]\)",
    ),
    Misuse(
        "scan-partial-fresh-state",
        "`lax.scan` over partial updates from a fresh state",
        _scan_partial_from_fresh_state,
        TypeError,
        r"inside `jax\.lax\.scan`, this update leaves out 'head/w'.*run the first step before "
        r"the loop",
    ),
    Misuse(
        "float16-adafactor",
        "float16 params with Adafactor's defaults (a warning)",
        _float16_adafactor,
        UserWarning,
        r"float16 params at 'w' keep the second moments `v_row`, `v_col` and `v` in "
        r"float16.*v_dtype=jnp.float32",
    ),
    Misuse(
        "muon-kernel-without-axes",
        "`muon_mask` selecting a 4-D convolution kernel without its matrix axes",
        _muon_kernel_without_axes,
        ValueError,
        r"`muon_mask` selects the parameter at 'conv' of shape \(3, 3, 4, 8\).*"
        r"muon_weight_dimension_numbers",
    ),
    Misuse(
        "lookahead-reset-without-params",
        "`lookahead(..., reset_state=True).update(grads, state)` without the params",
        _lookahead_reset_without_params,
        ValueError,
        r"lookahead\(reset_state=True\) needs the params.*tx.update\(updates, state, params\)",
    ),
    Misuse(
        "save-function-leaf",
        "`gradtx.save` of a model holding a function (an Equinox module's activation)",
        _save_function_leaf,
        TypeError,
        r"the params leaf at 'act' is a function, not an array.*eqx.filter\(model, eqx.is_array\)",
    ),
    Misuse(
        "restore-into-function-leaf",
        "`gradtx.restore` into a whole Equinox model (functions beside the arrays)",
        _restore_into_function_leaf,
        TypeError,
        r"the params_like leaf at 'act' is a function, not an array.*eqx.combine\(params, model\)",
    ),
    Misuse(
        "restore-damaged-file",
        "`gradtx.restore` of a checkpoint with a flipped bit",
        _restore_damaged,
        ValueError,
        r"'ckpt.safetensors' is damaged: the bytes of tensor\(s\) \['.*'\] differ",
    ),
    Misuse(
        "restore-old-schema",
        "`gradtx.restore` of a checkpoint of another schema version (`0`)",
        _restore_old_schema,
        ValueError,
        r"schema version '0', older than the version '1' this gradtx reads",
    ),
    Misuse(
        "restore-changed-mask",
        "`gradtx.restore` into `adamw` with another weight-decay mask than the saved one",
        _restore_other_mask,
        gradtx.StateMismatchError,
        r"(?s)fingerprint changed.*adamw/add_decayed_weights: mask '\*\*/w' -> 'enc/\*\*'",
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
