"""Float16 params with squared-gradient statistics: one warning at `init`, for every family.

In float16 a squared gradient of 1e-3 (1e-6) is below the smallest normal number, so second
moments, sums of squares and factored moments kept there round towards zero and the update
blows up. Every family that keeps such statistics warns at `init`, naming the path, the
statistic and the argument that keeps it in float32; the families without them do not.
"""

from __future__ import annotations

import re
import warnings

import jax.numpy as jnp
import numpy as np
import pytest

import gradtx
from gradtx import contrib

PARAMS = {"w": jnp.zeros((3, 4), jnp.float16), "b": jnp.zeros(4, jnp.float32)}

# (the transformation's name, the statistic as the warning names it, the argument), then
# the family without and with that argument (None: the family has no such argument).
FAMILIES = {
    "adam": (
        ("scale_by_adam", "the second moment `nu`", "nu_dtype"),
        lambda **kw: gradtx.adam(1e-3, **kw),
    ),
    "adamw": (
        ("scale_by_adam", "the second moment `nu`", "nu_dtype"),
        lambda **kw: gradtx.adamw(1e-3, **kw),
    ),
    "adafactor": (
        ("scale_by_factored_rms", "the second moments `v_row`, `v_col` and `v`", "v_dtype"),
        lambda **kw: gradtx.adafactor(1e-3, min_dim_size_to_factor=2, **kw),
    ),
    "adafactor-unfactored": (
        ("scale_by_factored_rms", "the second moments `v_row`, `v_col` and `v`", "v_dtype"),
        lambda **kw: gradtx.adafactor(1e-3, factored=False, **kw),
    ),
    "rmsprop": (
        ("scale_by_rms", "the second moment `nu`", "nu_dtype"),
        lambda **kw: gradtx.rmsprop(1e-3, **kw),
    ),
    "rmsprop-centered": (
        ("scale_by_stddev", "the second moment `nu`", "nu_dtype"),
        lambda **kw: gradtx.rmsprop(1e-3, centered=True, **kw),
    ),
    "adagrad": (
        ("scale_by_rss", "the sum of squares `sum_of_squares`", "accumulator_dtype"),
        lambda **kw: gradtx.adagrad(1e-3, **kw),
    ),
    "adadelta": (
        (
            "scale_by_adadelta",
            "the averages of squares `mean_sq_grad` and `mean_sq_update`",
            "accumulator_dtype",
        ),
        lambda **kw: gradtx.adadelta(1e-3, **kw),
    ),
    "sm3": (
        ("scale_by_sm3", "the accumulators of squared gradients `v`", "v_dtype"),
        lambda **kw: gradtx.sm3(1e-3, **kw),
    ),
    "amsgrad": (
        ("scale_by_amsgrad", "the second moments `nu` and `nu_max`", "nu_dtype"),
        lambda **kw: gradtx.amsgrad(1e-3, **kw),
    ),
    "adamax": (
        ("scale_by_adamax", "the infinity norm `nu`", "nu_dtype"),
        lambda **kw: gradtx.adamax(1e-3, **kw),
    ),
    "adabelief": (
        ("scale_by_belief", "the second moment `nu`", "nu_dtype"),
        lambda **kw: gradtx.adabelief(1e-3, **kw),
    ),
    "radam": (
        ("scale_by_radam", "the second moment `nu`", "nu_dtype"),
        lambda **kw: gradtx.radam(1e-3, **kw),
    ),
    "yogi": (
        ("scale_by_yogi", "the second moment `nu`", "nu_dtype"),
        lambda **kw: gradtx.yogi(1e-3, **kw),
    ),
    "adan": (
        ("scale_by_adan", "the second moment `nu`", "nu_dtype"),
        lambda **kw: gradtx.adan(1e-3, **kw),
    ),
    "lamb": (
        ("scale_by_adam", "the second moment `nu`", "nu_dtype"),
        lambda **kw: gradtx.lamb(1e-3, **kw),
    ),
    "novograd": (
        ("scale_by_novograd", "the second moment `nu`", None),
        lambda **kw: gradtx.novograd(1e-3, **kw),
    ),
    "adopt": (
        ("scale_by_adopt", "the second moment `nu`", None),
        lambda **kw: contrib.adopt(1e-3, **kw),
    ),
    "acprop": (
        ("scale_by_acprop", "the centred second moment `nu`", None),
        lambda **kw: contrib.acprop(1e-3, **kw),
    ),
    "ademamix": (
        ("scale_by_ademamix", "the second moment `nu`", "mu_dtype"),
        lambda **kw: contrib.ademamix(1e-3, **kw),
    ),
    "simplified_ademamix": (
        ("scale_by_simplified_ademamix", "the second moment `n`", None),
        lambda **kw: contrib.simplified_ademamix(1e-3, **kw),
    ),
    "madgrad": (
        ("scale_by_madgrad", "the sum of squared gradients `grad_sum_sq`", None),
        lambda **kw: contrib.madgrad(1e-3, **kw),
    ),
    "prodigy": (
        ("prodigy", "the second moment `exp_avg_sq`", None),
        lambda **kw: contrib.prodigy(**kw),
    ),
    "dadapt_adamw": (
        ("dadapt_adamw", "the second moment `exp_avg_sq`", None),
        lambda **kw: contrib.dadapt_adamw(**kw),
    ),
    # Muon's Adam part: `w` is left out of `muon_mask`, so Adam keeps its second moment
    "muon": (
        ("muon", "Adam's second moment `nu`", None),
        lambda **kw: contrib.muon(1e-3, muon_mask="b"),
    ),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_with_squared_statistics_warns_once_naming_the_fix(family):
    (owner, statistic, argument), make = FAMILIES[family]
    if argument is None:
        fix = "Train these params in float32 or bfloat16 (which has float32's range)."
    else:
        fix = f"Pass `{argument}=jnp.float32`."
    message = (
        f"{owner}: the float16 params at 'w' keep {statistic} in float16, where "
        if family != "adamax"
        else f"{owner}: the float16 params at 'w' keep {statistic} in float16, where a small"
    )
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        make().init(PARAMS)
    assert len(seen) == 1, [str(w.message) for w in seen]
    assert issubclass(seen[0].category, UserWarning)
    text = str(seen[0].message)
    assert text.startswith(message), text
    assert text.endswith(fix), text
    assert "'b'" not in text  # float32 params keep float32 statistics
    if argument is not None:  # the fix silences it (warnings are errors in the tests)
        state = make(**{argument: jnp.float32}).init(PARAMS)
        dtypes = {k: v.dtype for k, v in gradtx.state_dict(state).items() if k.endswith("/w")}
        assert jnp.float32 in dtypes.values(), dtypes
        make(**{argument: jnp.float16}).init(PARAMS)  # asked for: no warning either


@pytest.mark.parametrize(
    "make",
    [
        lambda: gradtx.sgd(1e-3),
        lambda: gradtx.sgd(1e-3, momentum=0.9, nesterov=True),
        lambda: gradtx.lion(1e-3),
        lambda: gradtx.signum(1e-3),
        lambda: contrib.muon(1e-3),  # `w` is a matrix: Muon keeps only a momentum for it
    ],
    ids=["sgd", "sgd-momentum", "lion", "signum", "muon-matrix"],
)
def test_families_without_squared_statistics_do_not_warn(make):
    make().init(PARAMS)  # a warning would be an error here


def test_no_warning_for_bfloat16_float32_and_unselected_params():
    gradtx.adam(1e-3).init({"w": jnp.zeros(3, jnp.bfloat16), "b": jnp.zeros(3)})
    tx = gradtx.masked(gradtx.adam(1e-3), "b")
    tx.init(PARAMS)  # `w` (float16) is outside the mask: it keeps no second moment


def test_packed_float16_params_warn_with_their_paths():
    packed = gradtx.pack({"w": jnp.zeros(3, jnp.float16), "b": jnp.zeros(2)})
    with pytest.warns(UserWarning, match=re.escape("float16 params at 'w' keep")):
        gradtx.adam(1e-3).init(packed)


def test_adafactor_in_float16_gives_nan_without_the_fix_and_finite_steps_with_it():
    """The failure the warning is about: a zero gradient element (or one whose square
    underflows) makes Adafactor's float16 second moment zero and the update 0/0."""
    params = {"w": jnp.ones((4, 4), jnp.float16)}
    g = {"w": jnp.asarray(np.diag([0.0, 1e-3, 1e-4, 1.0]), jnp.float16)}
    with pytest.warns(UserWarning, match="v_dtype=jnp.float32"):
        plain = gradtx.adafactor(1e-2, factored=False)
        u, _ = plain.update(g, plain.init(params), params)
    assert not bool(jnp.all(jnp.isfinite(u["w"])))
    fixed = gradtx.adafactor(1e-2, factored=False, v_dtype=jnp.float32)
    state = fixed.init(params)
    for _ in range(3):
        u, state = fixed.update(g, state, params)
        assert bool(jnp.all(jnp.isfinite(u["w"])))
        params = gradtx.apply_updates(params, u)
    assert params["w"].dtype == jnp.float16 and bool(jnp.all(jnp.isfinite(params["w"])))
