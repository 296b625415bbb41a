"""examples/train_sharded.py and examples/multihost.py: every layout trains like one device.

One child process with 8 CPU devices sets up each layout of the example on a small model, checks
that the state's shardings are those `gradtx.state_shardings` promised (after `init` and after
the steps), and reports what it measured; the tests below read its report. Two more runs: the
example's command line (tp), and two processes joined by `jax.distributed` (multihost.py).
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest
from devices import cpu_devices_env

# Slow (a subprocess, or a whole run): left out of `make quick` (see CONTRIBUTING.md).
pytestmark = pytest.mark.slow

# The repository's examples (gradtx itself may be installed elsewhere).
EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
SMALL = ["--dim", "32", "--hidden", "64", "--batch", "32"]  # every dim divisible by 8
STEPS = 5
LAYOUTS = ("dp", "fsdp", "tp", "dp_zero1")
MARKER = "GRADTX-SHARDED-REPORT "

SCRIPT = r"""
import json, sys
import jax
import numpy as np

jax.config.update("jax_numpy_dtype_promotion", "strict")
sys.path.insert(0, EXAMPLES)
import gradtx
import train_sharded as ex

assert len(jax.devices()) == 8, jax.devices()
config = ex.Config(dim=32, hidden=64, batch=32)


def by_path(tree):
    return {
        jax.tree_util.keystr(path, simple=True, separator="/"): leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(tree)
    }


def misplaced(state, expected):
    # Leaves whose sharding is not the promised one (P("x") and P("x", None) are equivalent).
    found, promised = by_path(state), by_path(expected)
    assert found.keys() == promised.keys(), (sorted(found), sorted(promised))
    return [
        f"{key}: {leaf.sharding} is not {promised[key]}"
        for key, leaf in found.items()
        if not leaf.sharding.is_equivalent_to(promised[key], leaf.ndim)
    ]


def specs(state):
    return {k: [str(e) for e in v.sharding.spec] for k, v in gradtx.state_dict(state).items()}


reference = ex.setup("single", config)
ref_params, _, ref_loss = ex.train(reference, config, STEPS)
ref_params = {k: np.asarray(v) for k, v in by_path(ref_params).items()}
np.savez(OUT + "/single.npz", **ref_params)

report = {}
for layout in ("dp", "fsdp", "tp", "dp_zero1"):
    run = ex.setup(layout, config)
    shard_over = "data" if layout == "dp_zero1" else None
    # The promise, made from shapes and shardings alone.
    abstract = jax.tree.map(
        lambda p, s: jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=s),
        run.params,
        run.param_shardings,
    )
    expected = gradtx.state_shardings(run.tx, abstract, shard_over=shard_over)
    entry = {
        "init_misplaced": misplaced(run.state, expected),
        "init_specs": specs(run.state),
        "params_bytes": ex.bytes_per_device(run.params),
        "state_bytes": ex.bytes_per_device(run.state),
        "collectives": ex.collectives(run.step.as_text()),
        "memory": ex.step_memory(run.step),
        "slots": [
            [s.key, s.param, s.note]
            for s in gradtx.slot_layouts(run.tx, abstract, shard_over=shard_over)
        ],
    }
    if layout == "fsdp":  # ZeRO-1 over params already split over "data"
        entry["zero1_slots"] = [
            [s.key, s.param, s.note]
            for s in gradtx.slot_layouts(run.tx, abstract, shard_over="data")
        ]
    params, state, loss = ex.train(run, config, STEPS)
    entry["final_misplaced"] = misplaced(state, expected)
    entry["params_misplaced"] = misplaced(params, run.param_shardings)
    entry["max_diff"] = max(
        float(np.max(np.abs(np.asarray(v) - ref_params[k]))) for k, v in by_path(params).items()
    )
    entry["loss"], entry["ref_loss"] = loss, ref_loss
    if layout in ("fsdp", "dp_zero1"):
        restored = ex.save_and_restore(run, params, state, f"{OUT}/{layout}.safetensors")
        entry["checkpoint_equal"] = ex.equal((params, state), restored)
    report[layout] = entry

print("GRADTX-SHARDED-REPORT " + json.dumps(report))
"""


def _run(args: list[str], env: dict[str, str], timeout: float = 180) -> tuple[int, str]:
    """Run a command in a process group of its own, so that a timeout ends its children too."""
    proc = subprocess.Popen(
        args,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{args} ran past {timeout} s:\n{out[-4000:]}")
    return proc.returncode, out


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("sharded")


@pytest.fixture(scope="module")
def report(out_dir) -> dict:
    script = f"EXAMPLES = {str(EXAMPLES)!r}\nOUT = {str(out_dir)!r}\nSTEPS = {STEPS}\n" + SCRIPT
    code, out = _run([sys.executable, "-c", script], cpu_devices_env(8))
    assert code == 0, out[-4000:]
    line = next((x for x in out.splitlines() if x.startswith(MARKER)), None)
    assert line, out[-4000:]
    return json.loads(line[len(MARKER) :])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_trains_like_one_device(report, layout):
    entry = report[layout]
    assert entry["max_diff"] < 1e-5, entry["max_diff"]
    assert abs(entry["loss"] - entry["ref_loss"]) < 1e-5


@pytest.mark.parametrize("layout", LAYOUTS)
def test_state_keeps_the_promised_shardings(report, layout):
    entry = report[layout]
    assert not entry["init_misplaced"], entry["init_misplaced"]
    assert not entry["final_misplaced"], entry["final_misplaced"]
    assert not entry["params_misplaced"], entry["params_misplaced"]


# Adam's first moment of the first up-projection, per layout: the spec it is made with.
EXPECTED_SPECS = {
    "dp": [],
    "fsdp": ["data"],
    "tp": ["None", "model"],
    "dp_zero1": ["data"],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_are_the_intended_ones(report, layout):
    spec = report[layout]["init_specs"]["mu/blocks/0/up/kernel"]
    while spec and spec[-1] == "None":
        spec.pop()
    assert spec == EXPECTED_SPECS[layout]
    assert report[layout]["init_specs"]["count/blocks/0/up/kernel"] == []
    collectives = report[layout]["collectives"]
    assert collectives["all-reduce"] >= 1  # gradients (dp, zero1, fsdp) or partial sums (tp)
    if layout in ("fsdp", "dp_zero1"):
        assert collectives["all-gather"] >= 1  # params gathered for use, or after the update
    if layout == "dp":
        assert collectives["all-gather"] == 0


def test_zero1_keeps_an_eighth_of_the_state(report):
    dp, zero1 = report["dp"], report["dp_zero1"]
    assert zero1["params_bytes"] == dp["params_bytes"]  # params stay replicated
    assert zero1["state_bytes"] / dp["state_bytes"] < 0.2
    assert zero1["memory"]["arguments"] < dp["memory"]["arguments"]


def test_zero1_names_the_slot_it_cannot_split(report):
    notes = {key: (param, note) for key, param, note in report["dp_zero1"]["slots"]}
    assert notes["mu/head/bias"] == (
        "head/bias",
        "as its parameter: no dimension divisible by 8",
    )
    assert notes["mu/blocks/0/up/kernel"] == ("blocks/0/up/kernel", "over 'data' on dim 0")
    # Under fsdp the params are already over "data": ZeRO-1 has nothing to add there.
    notes = {key: note for key, _, note in report["fsdp"]["zero1_slots"]}
    assert notes["nu/blocks/1/down/kernel"] == "as its parameter: already over 'data'"
    assert not any(note.startswith("over") for note in notes.values())


@pytest.mark.parametrize("layout", ["fsdp", "dp_zero1"])
def test_sharded_checkpoint_round_trip(report, layout):
    assert report[layout]["checkpoint_equal"]


def test_example_command_line_tp():
    args = [sys.executable, str(EXAMPLES / "train_sharded.py"), "--layout", "tp"]
    code, out = _run([*args, "--steps", "3", *SMALL], cpu_devices_env(8))
    assert code == 0, out[-4000:]
    assert "layout tp: mesh data=2, model=4" in out
    assert "per device: params" in out and "compiled step per device:" in out
    assert "collectives: all-reduce " in out and "collectives: all-reduce 0," not in out
    assert "final loss" in out and "FAILED" not in out


def test_two_processes_agree_on_the_trained_params(report, out_dir):
    # `report` first: its child wrote the single-device reference.
    folder = out_dir / "multihost"
    args = [sys.executable, str(EXAMPLES / "multihost.py"), "--launch", "2"]
    args += ["--layout", "dp_zero1", "--steps", str(STEPS), *SMALL, "--out", str(folder)]
    args += ["--checkpoint", str(out_dir / "multihost.safetensors")]
    code, out = _run(args, cpu_devices_env(1))
    assert code == 0, out[-4000:]
    assert "process 1 of 2: 4 local devices, 8 in all" in out
    assert out.count("checkpoint restored in the same layout, equal: True") == 2, out[-4000:]
    first, second = (np.load(folder / f"params_{i}.npz") for i in (0, 1))
    reference = np.load(out_dir / "single.npz")
    assert sorted(first.files) == sorted(second.files) == sorted(reference.files)
    for key in reference.files:
        np.testing.assert_array_equal(first[key], second[key])
        np.testing.assert_allclose(first[key], reference[key], rtol=0, atol=1e-5)
