"""Shared argument descriptions complete each docstring, and a gap or a stray entry raises."""

import inspect

import pytest

import gradtx
from gradtx._transforms.shared_args import SHARED_ARGS, with_shared_args


def test_every_argument_of_adamw_is_described_in_the_order_of_its_signature():
    doc = inspect.getdoc(gradtx.adamw)
    args = doc.split("Args:")[1]
    positions = [
        args.index(f"\n    {name}:") for name in inspect.signature(gradtx.adamw).parameters
    ]
    assert positions == sorted(positions)
    assert SHARED_ARGS["b1"] in args


def test_an_argument_described_nowhere_raises_naming_it():
    def step(b1: float, unknown_knob: int) -> None:
        """Step.

        Args:
            b1: own words.
        """

    with pytest.raises(TypeError, match="argument `unknown_knob` is not described"):
        with_shared_args(step)


def test_a_description_of_an_argument_not_taken_raises():
    def step(b1: float) -> None:
        """Step.

        Args:
            b2: a stray entry.
        """

    with pytest.raises(TypeError, match="describes `b2`, which it does not take"):
        with_shared_args(step)


def test_own_words_win_over_the_shared_ones():
    def step(b1: float, eps: float) -> None:
        """Step.

        Args:
            b1: own words.
        """

    doc = with_shared_args(step).__doc__
    assert "b1: own words." in doc and f"eps: {SHARED_ARGS['eps']}" in doc
