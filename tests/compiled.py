"""The compiled program of a donated training step, as the tests that count its copies read it."""

from __future__ import annotations

import re
from typing import Any

import jax

import gradtx


def compiled_step(
    tx: Any, params: Any, grads: Any, apply: Any = None, *, donate: bool = True
) -> jax.stages.Compiled:
    """`tx`'s jitted step `(params, state, grads) -> (params, state)`, compiled for arrays
    like `params` and `grads`, with params and state donated unless `donate` is False;
    `apply` adds the updates to the params (default `gradtx.apply_updates`). It runs as a
    training step does, and its text is the program the copy counts read."""
    apply = gradtx.apply_updates if apply is None else apply

    def step(p, s, g):
        updates, s = tx.update(g, s, p)
        return apply(p, updates), s

    jitted = jax.jit(step, donate_argnums=(0, 1) if donate else ())
    return jitted.lower(params, tx.init(params), grads).compile()


def entry_computation(program: str) -> str:
    """The program's entry computation, without the computations it calls."""
    return program[program.index("ENTRY") :]


def donated_step_program(
    tx: Any, params: Any, grads: Any, apply: Any = None, *, whole: bool = False
) -> str:
    """The entry computation of `compiled_step(tx, params, grads, apply)`, donated; `whole`
    keeps the computations it calls (the branches of a `lax.cond`, the bodies of loops)."""
    hlo = compiled_step(tx, params, grads, apply).as_text()
    return hlo if whole else entry_computation(hlo)


# A copy of a floating-point array in a compiled program (params, gradients or state); the
# group is the instruction copied.
FLOAT_ARRAY_COPY = re.compile(r"= (?:bf16|f16|f32|f64|c64|c128)\[[0-9,]+\]\S* copy\(%([^)]*)\)")

_ARRAY_DEF = re.compile(
    r"%(\S+) = (?:bf16|f16|f32|f64|c64|c128)\[[0-9,]+\](\{[^}]*\})? (\S+)\((%[^,)]+)?"
)
_COMPUTATION = re.compile(r"^(ENTRY )?%(\S+) .*?\{\n(.*?)\n\}$", re.M | re.S)


_ARGUMENT = re.compile(r'%(\S+) = \S+ parameter\(\d+\), metadata=\{op_name="([^"]*)"')


def argument_names(program: str) -> dict[str, str]:
    """The program's parameters, each named as the step's argument it is (`g['w']`)."""
    return {name: label.replace("\\", "") for name, label in _ARGUMENT.findall(program)}


def _branch_operands(program: str) -> dict[str, list[str]]:
    """For each branch of a `lax.cond`, the names its operand's elements have in the
    computation calling it: the step's argument (`g['w']`, `s['acc']['w']`) where an element
    is one, else the instruction's name."""
    bodies = {name: body for _, name, body in _COMPUTATION.findall(program)}
    arguments = argument_names(program)
    out: dict[str, list[str]] = {}
    for body in bodies.values():
        tuples = dict(re.findall(r"%(\S+) = \(.*?\) tuple\(([^)]*)\)", body))
        for operands, branches in re.findall(
            r"conditional\(%[^,]+, ([^)]*)\), branch_computations=\{([^}]*)\}", body
        ):
            for operand, branch in zip(operands.split(", "), branches.split(", ")):
                elements = tuples.get(operand[1:], "").split(", ")
                out[branch[1:]] = [arguments.get(e[1:], e[1:]) for e in elements]
    return out


def copies_in_called_computations(program: str) -> list[str]:
    """The float arrays that the computations a whole `program` calls (the branches of a
    `lax.cond`, the bodies of loops) copy to a buffer of the same layout, each one a pass over
    memory: a copy instruction, or a kernel that only copies. Copies inside a fused kernel
    and copies that change the layout (a transpose for a library call) are left out. A
    branch's copy of an element of its operand is named as the step's argument it is
    (`g['w']`), where it is one."""
    layouts = {name: layout for name, layout, _, _ in _ARRAY_DEF.findall(program)}
    bodies = {name: body for entry, name, body in _COMPUTATION.findall(program) if not entry}
    fused = set(re.findall(r"fusion\(.*?calls=%([^,\s]+)", program))
    operands = _branch_operands(program)

    def copies(body: str) -> list[str]:
        found = _ARRAY_DEF.findall(body)
        return [x[1:] for n, lay, op, x in found if op == "copy" and layouts.get(x[1:]) == lay]

    out = []
    for name, body in bodies.items():
        if name in fused:
            continue
        elements = dict(re.findall(r"%(\S+) = \S+ get-tuple-element\(%[^)]*\), index=(\d+)", body))
        for source in copies(body):
            index = elements.get(source)
            if name in operands and index is not None and int(index) < len(operands[name]):
                out.append(operands[name][int(index)])
            else:
                out.append(source)
        for kernel, body_name in re.findall(r"%(\S+) = .*? fusion\(.*?calls=%([^,\s]+)", body):
            kernel_body = bodies.get(body_name, "")
            if copies(kernel_body) and len(_ARRAY_DEF.findall(kernel_body)) == 2:
                out.append(kernel)  # a kernel of a parameter and its copy
    return out
