"""What the benchmark programs' command lines share: a filter that selects nothing is an error.

A misspelt `--only` or `--config` would otherwise run nothing, and `benchmarks.run` would
then write an empty report over the last one.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence


def check_selected(
    parser: argparse.ArgumentParser, chosen: Sequence, option: str, value: object, names: Iterable
) -> None:
    """Stop with `parser`'s usage error if `option`'s `value` left nothing of `names` to run.

    Args:
        parser: the program's parser; its `error` prints the usage and exits with status 2.
        chosen: what the filter selected.
        option: the option's flag, as the user typed it (`--only`).
        value: what the user gave it.
        names: the names the filter chose from, listed in the message.

    Example:
        >>> parser = argparse.ArgumentParser(prog="bench")
        >>> names = ["one big leaf", "2000 small leaves"]
        >>> chosen = [name for name in names if "leaves" in name]
        >>> check_selected(parser, chosen, "--only", "leaves", names)  # one left: no error
    """
    if not chosen:
        listed = ", ".join(repr(name) for name in names)
        parser.error(f"{option} {value!r} selects nothing; the names are: {listed}")


def add_config_option(parser: argparse.ArgumentParser, configs: Iterable) -> None:
    """Add `--config NAME` (repeatable), whose names are those of `configs`.

    A name that is not one of them is a usage error that lists them (argparse's `choices`).

    Example:
        >>> from benchmarks.configs import configs
        >>> parser = argparse.ArgumentParser(prog="bench")
        >>> add_config_option(parser, configs())
        >>> parser.parse_args(["--config", "adam"]).config
        ['adam']
    """
    parser.add_argument(
        "--config",
        action="append",
        choices=sorted({config.name for config in configs}),
        default=None,
        metavar="NAME",
        help="run only this configuration (repeatable)",
    )
